"""SQL over the cluster's datasets, run by DuckDB at the catalog, each scan reaching the nodes.

Every dataset a query names is a table (``"sales@3"``: version 3), shown to
DuckDB as its ``duckdb_scan()``, so the nodes send only the columns and rows the
query needs. DuckDB runs with external access off (:mod:`.system_functions`), in
one database bounding every query's memory together (:mod:`.engine`); the
planners decide what runs where (:mod:`.planners`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.flight as flight

from flightpart import frames
from flightpart.client import Client, connect
from flightpart.client.duckdb_source import shown_to_duckdb
from flightpart.errors import DatasetNotFound, FlightpartError, QueryTimeout, RequestRejected
from flightpart.io.access import Access
from flightpart.kept import Kept
from flightpart.wire import decode_flight_info

from . import binding, scans
from .callers import CALLER, check_caller
from .collected import Count
from .duckdb_errors import SqlError, failed
from .engine import Engine
from .explained import EXPLAIN_SCHEMA, explained, explained_query, scan_explained
from .limits import SqlLimits
from .names import VERSIONED, dataset_named, lists_tables, named_datasets, names_dataset
from .planners import PLANNERS, Bound, Planner, Query, Route, moved_so_far, ready
from .remembered import ScanFailures
from .schemas import MAX_TEXT, SchemaCache
from .slots import QuerySlots, running_from_env
from .system_functions import refusal
from .watch import Stopped, Watch

log = logging.getLogger("flightpart.sql")

QUERY_SECONDS = 300.0
"""How long one query may run at the catalog before it is stopped (``Gateway.timeout``)."""
OPENED_KEPT = 32
"""At most this many opened datasets are kept for the next query (:meth:`Gateway.opened`), each of at most
:data:`OPENED_MOST_PARTITIONS` partitions; a larger one is opened for each query."""
OPENED_MOST_PARTITIONS = 4096


class Statements(NamedTuple):
    """What DuckDB reads a query's text as: ``one`` statement or not, the first one's ``kind`` and how many
    ``parameters`` it has."""

    one: bool
    kind: Any
    parameters: int


class Gateway:
    """Runs SQL for callers the catalog already authorized (see the module doc)."""

    planners: tuple[Planner, ...] = PLANNERS
    """The ways a query is answered, tried in order (:mod:`.planners`)."""

    def __init__(self, catalog_uri: str, access: Access, *, timeout: float = QUERY_SECONDS,
                 write_access: Access | None = None, slots: int | None = None, limits: SqlLimits | None = None,
                 latest: Callable[[], dict[str, int]] | None = None,
                 info_of: Callable[[str, int | None], flight.FlightInfo] | None = None):
        """A gateway to the catalog at ``catalog_uri``, read with ``access``; ``latest``: each dataset's latest
        committed version as the catalog's own state gives them, ``info_of``: the FlightInfo an open of a dataset
        (and version) is given there (without them, asked over Flight, as any client asks)."""
        self.catalog_uri = catalog_uri
        self._latest = latest
        self._info_of = info_of
        self._datasets: Kept[tuple[flight.FlightInfo, Any]] = Kept(OPENED_KEPT)
        self._read: Kept[Statements] = Kept()
        self.access = access
        self.write_access = write_access or access
        self._writer: Client | None = None
        self.timeout = timeout
        self.abandoned = 0  # queries stopped because their caller gave up
        limits = limits if limits is not None else SqlLimits()
        self.slots = QuerySlots(running_from_env() if slots is None else slots, per_caller=limits.queries_per_caller)
        self.engine = Engine(limits.memory, limits.spill, limits.spill_dir)
        self._client: Client | None = None
        self._lock = threading.Lock()
        self.schemas = SchemaCache()
        self.expected = SchemaCache()  # DuckDB's types of a query as written, for the planners (:func:`.ready`)

    def client(self) -> Client:
        with self._lock:
            if self._client is None or self._client.closed:
                self._client = connect(self.catalog_uri, access=self.access)
            return self._client

    def writer(self) -> Client:
        """A client that writes (``adbc_ingest``), for callers authorized as writers."""
        with self._lock:
            if self._writer is None or self._writer.closed:
                self._writer = connect(self.catalog_uri, access=self.write_access)
            return self._writer

    def close(self) -> None:
        with self._lock:
            for client in (self._client, self._writer):
                if client is not None:
                    client.close()
        self.engine.close()

    def tables(self, stopped: Callable[[], bool] = lambda: False, *, wanted: Callable[[str], bool] | None = None,
               schemas: bool = True) -> list[tuple[str, pa.Schema | None]]:
        """Every dataset's latest version whose name is ``wanted`` and the caller is shown (:data:`CALLER`): its name
        and schema (None without ``schemas``: a schema costs one call per dataset). :class:`Stopped` once
        ``stopped()``."""
        client = self.client()
        found: list[tuple[str, pa.Schema | None]] = []
        caller = CALLER.get()
        for name in sorted(self._latest_versions()):
            if (wanted is not None and not wanted(name)) or (caller is not None and not caller.shows(name)):
                continue
            if not schemas:
                found.append((name, None))
                continue
            if stopped():
                raise Stopped()
            try:
                found.append((name, client.info(name).schema))
            except DatasetNotFound:
                continue  # dropped since it was listed
        return found

    def version_table(self, table: str) -> tuple[str, pa.Schema] | None:
        """A version named as a table (``sales@3``): its name and schema, or None when it is no version of a dataset."""
        match = VERSIONED.match(table)
        caller = CALLER.get()
        if match is None or not self._is_dataset(table) or (caller is not None and not caller.shows(match["name"])):
            return None
        try:
            return table, self._dataset(table).schema
        except FlightpartError:
            return None

    def run(self, query: str, *, limit: int | None = None, parameters: pa.Table | None = None,
            cancelled: Callable[[], bool] = lambda: False, route: Route | None = None, caller: str = "",
            count: Count | None = None) -> pa.Table:
        """``query``'s answer, at most ``limit`` rows; ``parameters``: one row per execution, answers concatenated. It
        runs in one of :attr:`slots`, stopped once ``cancelled()``; ``route`` learns how it ran; ``count(nbytes)`` is
        told of each batch, and raises to stop it."""
        with self.slots.held(cancelled, caller):
            return self._run(query, limit=limit, parameters=parameters, cancelled=cancelled, route=route, count=count)

    def _run(self, query: str, *, limit: int | None, parameters: pa.Table | None, cancelled: Callable[[], bool],
             route: Route | None, count: Count | None = None) -> pa.Table:
        duckdb = _duckdb()

        con = self.engine.connect()
        stop = Watch(con, self.timeout, cancelled)  # a query that runs too long, or for no one, is stopped
        route = route if route is not None else Route()
        failures = ScanFailures()  # what a node's refusal inside DuckDB's scans was, to be raised as itself
        try:
            statements = self._statements(query, con)
            if statements.one and statements.kind == duckdb.StatementType.EXPLAIN:
                return self._explain(query, schema_only=limit == 0, count=count, parameters=parameters)
            named = self._checked(con, query, statements, stop)
            wanted = statements.parameters
            texts = binding.bound_texts(con, query, parameters, wanted) if wanted and parameters is not None else None
            if texts is not None:  # planned as the literal twins are: their work goes to the nodes
                answers = [self._answered(Query(con, text, named, self._dataset, failures, count,
                                                Bound(limit, None, 0)), route) for text in texts]
                return answers[0] if len(answers) == 1 else pa.concat_tables(answers)
            bound = Bound(limit, parameters, wanted)
            return self._answered(Query(con, query, named, self._dataset, failures, count, bound), route)
        except (duckdb.InterruptException, Stopped):
            raise self._stopped(stop) from None
        except duckdb.Error as exc:
            raise failed(exc, failures, self.engine, self._shown_names, names_dataset) from None
        finally:
            stop.done()
            con.close()

    def _checked(self, con: Any, query: str, statements: Statements, stop: Watch) -> list[str]:
        """The datasets ``query`` names, once it is one read naming nothing of DuckDB's (else :class:`SqlError`); a
        listing query gets every dataset registered."""
        duckdb = _duckdb()
        if not statements.one or statements.kind != duckdb.StatementType.SELECT:
            raise SqlError("one query is answered here (SELECT, WITH, VALUES, ...), nothing that writes or changes "
                           "settings: nothing was run", field="query")
        refused = refusal(con, query, self._is_dataset)  # DuckDB describing itself, a file: nothing runs
        if refused is not None:
            raise SqlError(refused, field="query")
        named = self._named(query)
        self._check_caller(named)
        if lists_tables(query, named):  # SHOW TABLES, information_schema: every dataset, as its columns only
            self._register_listed(con, named, stop)
        return named

    def _check_caller(self, named: list[str]) -> None:
        """:class:`~flightpart.errors.Forbidden` unless this call's caller (:data:`~.callers.CALLER`) may read every
        dataset of ``named``."""
        check_caller(named, self._dataset_names)

    def _answered(self, query: Query, route: Route) -> pa.Table:
        """``query``'s answer by the first of :attr:`planners` that does not decline, its way noted in ``route``."""
        ready(query, route, self.expected)
        for planner in self.planners:
            answer = planner.answer(query)
            if answer is not None:
                route.how, route.query = planner.how, query.text
                return answer
        raise AssertionError("the last planner answers every query")

    def _stopped(self, stop: Watch) -> FlightpartError:
        """The error of a query its watch stopped: its caller gave up, or its time ran out."""
        if stop.gave_up:
            self.abandoned += 1
            log.info("a query was stopped: its caller gave up (deadline passed or call cancelled)")
            return SqlError("the query was stopped: its caller gave up (its deadline passed)", field="query")
        return QueryTimeout(f"the query ran longer than the {self.timeout:g} s a query may run at the catalog, and "
                            "was stopped", field="query")

    def _explain(self, query: str, *, schema_only: bool, count: Count | None = None,
                 parameters: pa.Table | None = None) -> pa.Table:
        """``EXPLAIN query``: what ran where and the bytes each part moved (the query is run to measure them, but for a
        plain scan); ``parameters`` bound as the query would be (the first row's)."""
        inner = explained_query(query)
        if inner is None:
            raise SqlError("EXPLAIN is answered as 'EXPLAIN SELECT ...' (comments before it allowed)", field="query")
        if schema_only:
            return frames.empty_table(EXPLAIN_SCHEMA)
        if parameters is not None and parameters.num_rows:
            with self.engine.connect() as con:
                wanted = len(con.extract_statements(inner)[0].named_parameters)
                texts = binding.bound_texts(con, inner, parameters.slice(0, 1), wanted)
            if texts is None:
                raise SqlError(f"EXPLAIN with parameters: {parameters.num_columns} value(s) bound for {wanted} "
                               "placeholder(s), or values of a type not written as a literal (a list, struct or "
                               "enum), or numbered ones ($1): explain the query with its values written in",
                               field="parameters")
            inner = texts[0]
        scanned = self.scan(inner)
        if scanned is not None:
            return scan_explained(len(scanned[1]))
        before = moved_so_far()
        route = Route()
        answer = self._run(inner, limit=None, parameters=None, cancelled=lambda: False, route=route,
                           count=count)  # in its slot
        moved = moved_so_far() - before - sum(part.moved for part in route.first)
        return explained(route, answer.num_rows, moved, set(self._named(inner)), self._dataset, self._named)

    def scan(self, query: str) -> tuple[pa.Schema, list[Any]] | None:
        """For a plain scan (:mod:`.scans`), its schema and one endpoint per partition; else None."""
        if not self._one_select(query):
            return None
        named = self._named(query)
        planned = scans.plain_scan(query, set(named))
        if planned is None:
            return None
        self._check_caller(named)
        name, columns, where = planned
        return scans.endpoints(self._dataset(name), columns, where)

    def _one_select(self, query: str) -> bool:
        """Whether DuckDB reads ``query`` as one SELECT without named parameters."""
        duckdb = _duckdb()
        try:
            statements = self._statements(query)
        except duckdb.Error:
            return False
        return statements.one and not statements.parameters and statements.kind == duckdb.StatementType.SELECT

    def _statements(self, query: str, con: Any = None) -> Statements:
        """DuckDB's reading of ``query`` (on ``con``, or a cursor of the shared database: opening a DuckDB per query
        costs more than parsing; nothing runs, nothing is registered); kept per text of at most :data:`MAX_TEXT`
        characters, as DuckDB reads a text the same way each time."""
        known = self._read.get(query)
        if known is not None:
            return known
        if con is None:
            with self.engine.connect() as cursor:
                found = cursor.extract_statements(query)
        else:
            found = con.extract_statements(query)
        statements = Statements(len(found) == 1, found[0].type if found else None,
                                len(found[0].named_parameters) if found else 0)
        if len(query) <= MAX_TEXT:
            self._read.put(query, statements)
        return statements

    def schema(self, query: str, caller: str = "") -> pa.Schema:
        """The schema of ``query``'s answer, without reading its rows; a plain scan's is the dataset's own types, which
        its nodes send."""
        planned = self.scan(query)
        if planned is not None:
            return planned[0]
        if CALLER.get() is not None:  # a schema kept for another caller's text is not shown to one not allowed it
            self._check_caller(self._named(query))
        key = self._schema_key(query)
        schema = self.schemas.get(key) if key is not None else None
        if schema is None:
            schema = self.run(query, limit=0, caller=caller).schema
            if key is not None:
                self.schemas.put(key, schema)
        return schema

    def _schema_key(self, query: str) -> tuple | None:
        """What ``query``'s schema depends on: its text and the version of each dataset it names (None: not kept,
        see :mod:`.schemas`)."""
        if len(query) > MAX_TEXT:
            return None
        versions = self._latest_versions()
        named = named_datasets(query, lambda: set(versions))
        if lists_tables(query, named):
            return None
        return query, tuple((name, versions.get(name)) for name in named)

    def _register_listed(self, con: Any, named: list[str], stop: Watch) -> None:
        """Every dataset ``named`` leaves out, registered as an empty table of its columns for a listing query; one
        DuckDB cannot describe (a dense union) is left out."""
        duckdb = _duckdb()
        for name, schema in self.tables(lambda: stop.fired):
            if name in named:
                continue
            try:
                con.register(name, frames.empty_table(shown_to_duckdb(schema)))
                con.execute(f'DESCRIBE "{name.replace(chr(34), chr(34) * 2)}"').fetchall()
            except duckdb.InterruptException:  # the query's time is up (an Error too): not a dataset to leave out
                raise
            except (pa.ArrowException, duckdb.Error):
                con.unregister(name)
            if stop.fired:
                raise Stopped()
        if stop.fired:
            raise Stopped()

    def _named(self, query: str) -> list[str]:
        """The datasets ``query`` names that exist."""
        return named_datasets(query, self._dataset_names)

    def _dataset_names(self) -> set[str]:
        return set(self._latest_versions())

    def _shown_names(self) -> set[str]:
        """The datasets this call's caller is shown (:data:`CALLER`): what an error may suggest instead of a name."""
        caller = CALLER.get()
        names = self._dataset_names()
        return names if caller is None else {name for name in names if caller.shows(name)}

    def _latest_versions(self) -> dict[str, int]:
        """Each dataset's latest committed version."""
        if self._latest is not None:
            return self._latest()
        return {entry.name: entry.version for entry in self.client().list() if entry.version is not None}

    def _is_dataset(self, table: str) -> bool:
        """Whether a table name means a dataset (``name@version``: a version of one)."""
        return names_dataset(table, self._dataset_names())

    def _dataset(self, table: str) -> Any:
        """The dataset a table name means (``name@version``: that version), whatever its case as DuckDB matches
        names."""
        try:
            return self.opened(table)
        except DatasetNotFound:
            resolved = dataset_named(table, self._dataset_names())
            if resolved is None or resolved == table:
                raise
            return self.opened(resolved)

    def opened(self, table: str) -> Any:
        """The dataset ``table`` names, opened once per FlightInfo the catalog gives it: while its version, replicas,
        nodes and capability are the same (the catalog hands out the same FlightInfo object), so is the dataset, and
        what it worked out once (statistics' guarantees, column groups) serves every query."""
        match = VERSIONED.match(table)
        name, version = (match["name"], int(match["version"])) if match else (table, None)
        if self._info_of is None:
            return self.client().open(name, version)
        info = self._info_of(name, version)
        kept = self._datasets.get((name, version))
        if kept is not None and kept[0] is info:
            return kept[1]
        dataset = self.client().dataset_of(decode_flight_info(info))
        if len(info.endpoints) <= OPENED_MOST_PARTITIONS:
            self._datasets.put((name, version), (info, dataset))
        return dataset


def _duckdb() -> Any:
    """DuckDB; a catalog installed without it says so."""
    try:
        import duckdb
    except ImportError:
        raise RequestRejected("SQL needs DuckDB where the catalog runs: install flightpart[sql] there",
                              field="query") from None
    return duckdb
