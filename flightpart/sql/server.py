"""A catalog that also speaks Flight SQL, so ADBC clients (DB-API, R, Go, Java, JDBC/ODBC bridges) query datasets.

A ``GetFlightInfo`` with a Flight SQL command runs the query and answers with
one endpoint here, whose ticket ``DoGet`` turns into rows. Each call finds its
handler by the message's type (:data:`ANSWERS`, :data:`TICKETS`,
:data:`ACTIONS`, :data:`PUTS`); any other message is the catalog's own call, or
refused. Queries are authorized as reads and run in
:class:`~flightpart.sql.gateway.Gateway`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.flight as flight

from flightpart import sqlwire as proto
from flightpart.errors import FlightpartError, LimitExceeded, RequestRejected
from flightpart.frames import size_of
from flightpart.server.auth import authorize, peer_ip
from flightpart.server.base import Action, action_table, boundary, schema_error
from flightpart.server.catalog import CatalogServer
from flightpart.server.settings import CatalogSettings
from flightpart.tokens import role_token
from flightpart.wire import GetQueries, QueriesReply

from . import listing, puts
from .answers import Answers, Meter
from .callers import CALLER, ingest_check, reading_as
from .gateway import Gateway
from .history import QueryHistory, QueryRecord
from .limits import SqlLimits
from .metadata import sql_info, xdbc_type_info
from .planners import moved_so_far
from .prepared import PreparedStatements, unknown
from .sending import AnswersSent
from .slots import QuerySlots
from .statuses import sql_error

log = logging.getLogger("flightpart.sql")

SENT_BATCH_BYTES = 1 << 20
"""About how large a batch a DoGet stream sends is: a client reading part of an answer leaves the rest counted at the
catalog."""
BIND_WAIT_SECONDS = 30.0
"""The longest a bind waits for its turn to be read."""
CREATE_PREPARED = "CreatePreparedStatement"
CLOSE_PREPARED = "ClosePreparedStatement"
CLOSE_SESSION = "CloseSession"
GET_SESSION_OPTIONS = "GetSessionOptions"
"""Flight's session options, which an ADBC client asks for: the catalog keeps no session, so it answers none."""
NOT_CLOSEABLE = 3
"""CloseSessionResult's status when there is no session to close."""


class Asked(NamedTuple):
    """What a call asks of a command's answer: counted on ``meter``, only its schema when ``schema_only``, stopped once
    ``cancelled()``."""

    meter: Meter
    schema_only: bool
    cancelled: Callable[[], bool]


class SqlCatalogServer(CatalogServer):
    """The catalog, answering Flight SQL beside flightpart's own calls (see the module doc)."""

    def __init__(self, settings: CatalogSettings, *, sql_limits: SqlLimits | None = None, **kwargs: Any):
        super().__init__(settings, **kwargs)
        self.through_catalog = settings.sql_through_catalog
        limits = self.sql_limits = sql_limits if sql_limits is not None else SqlLimits.from_env()
        reader = role_token(self.secret, "reader", "sql-gateway") if self.secret is not None else None
        writer = role_token(self.secret, "writer", "sql-gateway") if self.secret is not None else None
        self.gateway = Gateway(self.uri, dataclasses.replace(self.pool.access, token=reader),
                               write_access=dataclasses.replace(self.pool.access, token=writer), limits=limits,
                               latest=lambda: dict(self.state.latest_versions()), info_of=self.opened_info)
        # answers handed to DoGet streams that have not ended count too (a reader that idles lets go)
        self.answers_sent = AnswersSent(SENT_BATCH_BYTES)
        self.answers = Answers(limits.answers, limits.answer, self.answers_sent)
        self.prepared = PreparedStatements(limits.prepared, limits.prepared_bytes, limits.prepared_idle)
        self.history = QueryHistory(moved_so_far, lambda seconds: self.telemetry.observe("sql_query", seconds))
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

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.RecordBatchStream:
        command = proto.unpack(ticket.ticket)
        with boundary(log, "Flight SQL DoGet", self.telemetry, context, sql_error):
            handler = TICKETS.get(command.name) if command is not None else None
            if handler is None:
                raise RequestRejected("DoGet: the catalog sends no rows of its own but a Flight SQL answer, whose "
                                      "ticket is a TicketStatementQuery; a dataset's rows come from its nodes, at the "
                                      "endpoints of its FlightInfo (a client that reads every answer from the "
                                      "catalog needs a catalog started with --sql-through-catalog)", field="ticket")
            authorize(context, "read")
            return handler(self, command)

    def do_action(self, context: Any, action: flight.Action) -> list[flight.Result]:
        handler = ACTIONS.get(action.type)
        if handler is None:
            return super().do_action(context, action)
        with boundary(log, f"Flight SQL {action.type}", self.telemetry, context, sql_error), self._as_caller(context):
            return handler(self, context, action)

    def do_put(self, context: Any, descriptor: flight.FlightDescriptor, reader: flight.MetadataRecordBatchReader,
               writer: flight.FlightMetadataWriter) -> None:
        """A prepared query's parameters, or ``adbc_ingest``'s stream; a catalog takes no other data."""
        command = _command(descriptor)
        with boundary(log, "Flight SQL DoPut", self.telemetry, context, sql_error), self._as_caller(context):
            if command is None:
                raise RequestRejected(f"{self.uri} is a flightpart catalog: it stores no data (put partitions to a "
                                      "node; a Flight SQL client binds parameters here)", field="descriptor")
            handler = PUTS.get(command.name)
            if handler is None:
                raise RequestRejected(f"Flight SQL: {command.name:.60} is not answered here: queries only, nothing "
                                      "that writes (executemany runs updates)", field="command")
            handler(self, context, command, reader, writer)

    def stats(self) -> dict:
        """The catalog's figures, with its SQL service's: queries abandoned, running, waiting and refused BUSY, and the
        bytes its answers, prepared statements and spill files hold."""
        slots = self.gateway.slots
        statements, bound = self.prepared.held()
        return {**super().stats(), "sql_queries_abandoned": self.gateway.abandoned,
                "sql_queries_running": slots.running,
                "sql_queries_waiting": slots.waiting, "sql_queries_refused_busy": slots.refused,
                "sql_answer_bytes": self.answers.held_bytes(), "sql_prepared": statements, "sql_prepared_bytes": bound,
                "sql_spill_bytes": self.gateway.engine.spilled_bytes()}

    def status(self) -> dict:
        """The catalog's status (nodes, datasets) and its SQL queries, running and recent (:mod:`.history`)."""
        return {**super().status(), "queries": self.history.snapshot()}

    def _queries(self, _: GetQueries) -> QueriesReply:
        return QueriesReply(self.history.snapshot())

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [*super().list_actions(context), (CREATE_PREPARED, "Flight SQL: prepare a query"),
                (CLOSE_PREPARED, "Flight SQL: forget a prepared query"),
                (CLOSE_SESSION, "answered NOT_CLOSEABLE: the catalog keeps no session")]

    def shutdown(self) -> None:
        self.gateway.close()
        super().shutdown()

    # ------------------------------------------------------------------ the calls' common steps

    def _read(self, context: Any, what: str, work: Any,
              sent_as: Callable[[FlightpartError], Exception] = sql_error) -> Any:
        """``work()`` for a caller allowed to read, inside the error boundary, its errors sent as ``sent_as`` makes
        them; a user's queries read only the datasets their grants allow (:meth:`_as_caller`)."""
        with boundary(log, what, self.telemetry, context, sent_as), self._as_caller(context):
            return work()

    def _as_caller(self, context: Any) -> Any:
        """The call's caller, allowed to read, as the gateway's caller while it is answered (:func:`.reading_as`)."""
        credential = authorize(context, "read")
        return reading_as(credential, peer_ip(context.peer()) if context else "", self.require, self.visible)

    @staticmethod
    def _caller(context: Any) -> str:
        """Who is calling, for the shares of :mod:`.limits`: a token's role and name; the owner by IP as well."""
        credential = authorize(context, "read")
        if credential.role != "owner":
            return f"{credential.role}:{credential.name}"
        peer = context.peer() if context is not None and hasattr(context, "peer") else ""
        return f"owner@{peer_ip(peer)}"

    def _info(self, command: proto.Any_, descriptor: flight.FlightDescriptor, context: Any = None) -> flight.FlightInfo:
        """A command's FlightInfo, noted in :attr:`history` (:mod:`.history`) with its SQL text (a metadata command
        by its name) as it runs."""
        prepared = self.prepared.get(_prepared_handle(command)) if command.name == proto.PREPARED_QUERY else None
        text = _query_text(command) if command.name == proto.STATEMENT_QUERY else (prepared or (command.name,))[0]
        with self.history.running(self._caller(context), text) as record:
            return self._info_of(command, descriptor, context, record)

    def _info_of(self, command: proto.Any_, descriptor: flight.FlightDescriptor, context: Any,
                 record: QueryRecord) -> flight.FlightInfo:
        """A plain scan's endpoints at the nodes, or one endpoint here for an answer counted as it is produced and
        kept until its DoGet (:class:`~.answers.Answers`); ``record`` is told the rows."""
        scanned = self._scan(command)
        if scanned is not None:  # the nodes send it: one endpoint per partition
            record.outcome = "endpoints"
            return flight.FlightInfo(scanned[0], descriptor, scanned[1], -1, -1)
        with self.answers.producing(self._caller(context)) as meter:
            table = self._answer(command, meter, cancelled=_gave_up(context))
            handle = self.answers.keep(meter, table)
        record.rows = table.num_rows
        size = size_of(table)
        ticket = proto.pack(proto.TICKET_STATEMENT, proto.message((1, handle)))
        return flight.FlightInfo(table.schema, descriptor, [flight.FlightEndpoint(ticket, [])], table.num_rows, size)

    def _schema_of(self, command: proto.Any_, caller: str) -> pa.Schema:
        """The schema of ``command``'s answer (a plain scan's: its nodes' types)."""
        scanned = self._scan(command)
        return scanned[0] if scanned is not None else self._answer(command, Meter(caller), schema_only=True).schema

    def _scan(self, command: proto.Any_) -> tuple[pa.Schema, list[flight.FlightEndpoint]] | None:
        """A plain scan's schema and endpoints (:mod:`.scans`), or None: always with ``--sql-through-catalog``, whose
        catalog answers every query itself, at one endpoint, and for a user, whose session a node does not take for
        rows (nodes read a user's rows only by capability)."""
        if self.through_catalog or CALLER.get() is not None:
            return None
        handler = SCANS.get(command.name)
        return handler(self, command) if handler is not None else None

    def _answer(self, command: proto.Any_, meter: Meter, *, schema_only: bool = False,
                cancelled: Callable[[], bool] = lambda: False) -> pa.Table:
        """The rows a command asks for (their schema only when ``schema_only``), counted on ``meter``; stopped once
        ``cancelled()``."""
        handler = ANSWERS.get(command.name)
        if handler is None:
            raise RequestRejected(f"Flight SQL: {command.name} is not answered here", field="command")
        return handler(self, command, Asked(meter, schema_only, cancelled))

    # ------------------------------------------------------------------ handlers of the tables below

    def _statement_scan(self, command: proto.Any_) -> tuple[pa.Schema, list[flight.FlightEndpoint]] | None:
        return self.gateway.scan(_query_text(command))

    def _prepared_scan(self, command: proto.Any_) -> tuple[pa.Schema, list[flight.FlightEndpoint]] | None:
        query, values = self.prepared.get(_prepared_handle(command)) or (None, None)
        return self.gateway.scan(query) if query is not None and values is None else None

    def _statement_answer(self, command: proto.Any_, asked: Asked) -> pa.Table:
        return self._run(_query_text(command), None, asked)

    def _prepared_answer(self, command: proto.Any_, asked: Asked) -> pa.Table:
        query, values = self.prepared.get(_prepared_handle(command)) or (None, None)
        if query is None:
            raise unknown()
        return self._run(query, values, asked)

    def _run(self, query: str, parameters: pa.Table | None, asked: Asked) -> pa.Table:
        """``query``'s answer, its batches counted on ``asked.meter`` (none for a schema)."""
        meter = asked.meter
        count = None if asked.schema_only else (lambda nbytes: self.answers.count(meter, nbytes))
        return self.gateway.run(query, limit=0 if asked.schema_only else None, parameters=parameters,
                                cancelled=asked.cancelled, caller=meter.caller, count=count)

    def _tables(self, command: proto.Any_, asked: Asked) -> pa.Table:
        return listing.tables(self.gateway, command.value, asked.schema_only)

    def _statement_stream(self, command: proto.Any_) -> flight.RecordBatchStream:
        """The answer kept under a ticket's handle, taken: it is sent once."""
        stream = self.answers.take(proto.bytes_field(command.value, 1, "statement_handle") or b"")
        if stream is None:
            raise RequestRejected("Flight SQL: no answer waits under this ticket (fetched already, or expired); "
                                  "run the query again", field="ticket")
        return stream

    def _session_options(self, context: Any, action: flight.Action) -> list[flight.Result]:
        return [flight.Result(pa.py_buffer(b""))]  # no option: an empty message

    def _create_prepared(self, context: Any, action: flight.Action) -> list[flight.Result]:
        command = _action_body(action)
        if command is None or command.name != proto.CREATE_PREPARED:
            raise RequestRejected("CreatePreparedStatement: expected an ActionCreatePreparedStatementRequest",
                                  field="action")
        query = _query_text(command)
        caller = self._caller(context)
        try:
            schema = self.gateway.schema(query, caller)
        except Exception as exc:
            self.history.refused(caller, query, exc)
            raise
        handle = self.prepared.add(caller, query)
        result = proto.message((1, handle), (2, schema.serialize().to_pybytes()))
        return [flight.Result(pa.py_buffer(proto.pack(proto.PREPARED_RESULT, result)))]

    def _close_prepared(self, context: Any, action: flight.Action) -> list[flight.Result]:
        command = _action_body(action)
        if command is None or command.name != proto.CLOSE_PREPARED:
            raise RequestRejected("ClosePreparedStatement: expected an ActionClosePreparedStatementRequest",
                                  field="action")
        self.prepared.close(_prepared_handle(command), self._caller(context))
        return []

    def _close_session(self, context: Any, action: flight.Action) -> list[flight.Result]:
        # an ADBC connection's close(): a catalog keeps no session (no cookie names one), so nothing of one
        # connection can be told from another's; the driver closes its prepared statements one by one
        _action_body(action)
        return [flight.Result(pa.py_buffer(proto.message((1, NOT_CLOSEABLE))))]

    def _ingest(self, context: Any, command: proto.Any_, reader: flight.MetadataRecordBatchReader,
                writer: flight.FlightMetadataWriter) -> None:
        credential, client = authorize(context, "write"), peer_ip(context.peer()) if context is not None else ""
        may_write = ingest_check(credential, client, self.require,
                                 lambda c, n: self.may(self.guard.standing(c), "write", n))
        stored = puts.ingest(self.gateway.writer, command.value, reader, may_write)
        writer.write(pa.py_buffer(proto.message((1, stored))))  # DoPutUpdateResult

    def _bind(self, context: Any, command: proto.Any_, reader: flight.MetadataRecordBatchReader,
              writer: flight.FlightMetadataWriter) -> None:
        caller = self._caller(context)
        handle = _prepared_handle(command)
        if self.prepared.get(handle) is None:
            raise unknown()
        with self.binds.held(_gave_up(context), caller):
            values, size = puts.parameters(reader, self.sql_limits.parameters)
        puts.check_sound(values, "bound parameters", "parameters")
        self.prepared.bind(handle, values, size, caller)
        writer.write(pa.py_buffer(proto.message((1, handle))))  # DoPutPreparedStatementResult


SqlCatalogServer.actions = {**CatalogServer.actions, **action_table(
    Action(GetQueries, SqlCatalogServer._queries, "the SQL queries running now and the last finished", "admin",
           changes_state=False))}

SCANS: dict[str, Callable[[SqlCatalogServer, proto.Any_], tuple[pa.Schema, list[flight.FlightEndpoint]] | None]] = {
    proto.STATEMENT_QUERY: SqlCatalogServer._statement_scan,
    proto.PREPARED_QUERY: SqlCatalogServer._prepared_scan,
}
"""GetFlightInfo and GetSchema: the commands whose answer may be a plain scan."""
ANSWERS: dict[str, Callable[[SqlCatalogServer, proto.Any_, Asked], pa.Table]] = {
    proto.STATEMENT_QUERY: SqlCatalogServer._statement_answer,
    proto.PREPARED_QUERY: SqlCatalogServer._prepared_answer,
    proto.GET_CATALOGS: lambda server, command, asked: listing.catalogs(),
    proto.GET_DB_SCHEMAS: lambda server, command, asked: listing.db_schemas(),
    proto.GET_TABLE_TYPES: lambda server, command, asked: listing.table_types(),
    proto.GET_TABLES: SqlCatalogServer._tables,
    proto.GET_SQL_INFO: lambda server, command, asked: sql_info(
        proto.uint_fields(command.value, 1), MAX_QUERY_CHARACTERS, server.prepared.idle_seconds * 1000),
    proto.GET_XDBC_TYPE_INFO: lambda server, command, asked: xdbc_type_info(
        proto.int32_field(command.value, 1, "data_type")),
}
"""GetFlightInfo and GetSchema: each command answered with rows, and how."""
TICKETS: dict[str, Callable[[SqlCatalogServer, proto.Any_], flight.RecordBatchStream]] = {
    proto.TICKET_STATEMENT: SqlCatalogServer._statement_stream,
}
"""DoGet: the tickets of answers kept at the catalog."""
ACTIONS: dict[str, Callable[[SqlCatalogServer, Any, flight.Action], list[flight.Result]]] = {
    GET_SESSION_OPTIONS: SqlCatalogServer._session_options,
    CREATE_PREPARED: SqlCatalogServer._create_prepared,
    CLOSE_PREPARED: SqlCatalogServer._close_prepared,
    CLOSE_SESSION: SqlCatalogServer._close_session,
}
"""DoAction: the Flight SQL actions, for callers allowed to read."""
PUTS: dict[str, Callable[[SqlCatalogServer, Any, proto.Any_, flight.MetadataRecordBatchReader,
                          flight.FlightMetadataWriter], None]] = {
    proto.INGEST: SqlCatalogServer._ingest,
    proto.PREPARED_QUERY: SqlCatalogServer._bind,
}
"""DoPut: ``adbc_ingest`` (for writers) and a prepared query's parameters."""


def _command(descriptor: flight.FlightDescriptor) -> proto.Any_ | None:
    """The Flight SQL message in a command descriptor, or None (a path: flightpart's own)."""
    if descriptor.descriptor_type != flight.DescriptorType.CMD:
        return None
    return proto.unpack(descriptor.command)


def _action_body(action: flight.Action) -> proto.Any_ | None:
    """The Flight SQL message an action carries, or None."""
    return proto.unpack(action.body.to_pybytes() if action.body is not None else b"")


def _prepared_handle(command: proto.Any_) -> bytes:
    return proto.bytes_field(command.value, 1, "prepared_statement_handle") or b""


MAX_QUERY_CHARACTERS = 1 << 20
"""Characters a query may have: reading one costs with its length, before and beside its slot (decision 0034)."""


def _query_text(command: proto.Any_) -> str:
    """The query a command carries (field 1), at most :data:`MAX_QUERY_CHARACTERS`."""
    text = proto.text_field(command.value, 1, "query") or ""
    if len(text) > MAX_QUERY_CHARACTERS:
        raise LimitExceeded(f"query: {len(text):,} characters, more than the {MAX_QUERY_CHARACTERS:,} a query may have",
                            field="query")
    return text


def _gave_up(context: Any) -> Callable[[], bool]:
    """Whether the caller gave up: its deadline passed or it cancelled."""
    if context is None or not hasattr(context, "is_cancelled"):
        return lambda: False
    return context.is_cancelled
