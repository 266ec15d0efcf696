"""SQL over the cluster's datasets, run by DuckDB at the catalog, each scan reaching the nodes.

Every dataset a query names is a table: ``sales`` is its latest version,
``"sales@3"`` version 3. It is shown to DuckDB as the dataset's
``duckdb_scan()``, so for each scan the nodes send only the columns the
query uses and, for the filters DuckDB pushes, only the rows they keep
(docs/querying.md, "DuckDB"); joins, aggregates, ORDER BY, LIMIT and
window functions run in DuckDB here. DuckDB runs with external access off
(no file, URL or extension a query could reach on the catalog's host), in
one database whose memory and spill space bound every query together
(:mod:`.engine`). An answer is read from DuckDB in batches, each counted
(``count``, :mod:`.answers`) before the next is read, so an answer past its
limit is stopped there rather than held whole first.
"""

from __future__ import annotations

import difflib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from flightpart import frames
from flightpart.client import Client, connect
from flightpart.client.duckdb_source import shown_to_duckdb
from flightpart.errors import DatasetNotFound, FlightpartError, LimitExceeded, QueryTimeout, RequestRejected, ServerError
from flightpart.io.access import Access
from flightpart.io.transfer import TRAFFIC
from flightpart.query.functions import AGGREGATE

from . import inlined, pushed, scans
from .engine import Engine
from .limits import SqlLimits
from .parsed import parsed
from .partials import PARTIALS
from .remembered import ScanFailures
from .slots import QuerySlots, running_from_env
from .system_functions import refusal

log = logging.getLogger("flightpart.sql")

QUERY_SECONDS = 300.0
"""How long one query may run at the catalog before it is stopped (``Gateway.timeout``)."""
ANSWER_BATCH_ROWS = 16_384
"""Rows of an answer read from DuckDB at a time, counted before the next are read."""
EXPLAIN = re.compile(r"explain(\s+analyze)?\s+", re.IGNORECASE)
EXPLAIN_SCHEMA = pa.schema([("step", pa.utf8()), ("where", pa.utf8()), ("what", pa.utf8()), ("bytes_moved", pa.int64()),
                            ("rows", pa.int64())])
"""What ``EXPLAIN`` answers: one row per part of the work."""
VERSIONED = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,127})@(?P<version>[0-9]{1,18})$")


@dataclass
class Route:
    """How a query ran, for ``EXPLAIN``: ``how`` (``aggregate``, ``top`` or ``scan``) for ``query`` as it ran, after
    its ``first`` parts were answered (:mod:`.inlined`)."""

    how: str = "scan"
    query: str = ""
    first: list[inlined.Answered] = field(default_factory=list)


class SqlError(RequestRejected):
    """A query DuckDB refused: a syntax error, an unknown column, a type error."""


class Gateway:
    """Runs SQL for callers the catalog already authorized (see the module doc)."""

    def __init__(self, catalog_uri: str, access: Access, *, timeout: float = QUERY_SECONDS,
                 write_access: Access | None = None, slots: int | None = None, limits: SqlLimits | None = None):
        self.catalog_uri = catalog_uri
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

    def client(self) -> Client:
        with self._lock:
            if self._client is None or self._client.closed:
                self._client = connect(self.catalog_uri, access=self.access)
            return self._client

    def writer(self) -> Client:
        """A client that writes (``adbc_ingest``), for callers the catalog authorized as writers."""
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
        """Every dataset's latest version (those whose name is ``wanted``): its name and schema (None without
        ``schemas``: one schema is asked of the catalog per dataset, which a list of names needs not); :class:`Stopped`
        once ``stopped()`` (a listing query ran past its time, or its caller gave up)."""
        client = self.client()
        found: list[tuple[str, pa.Schema | None]] = []
        for entry in client.list():
            name = entry["name"]
            if wanted is not None and not wanted(name):
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
        """A version named as a table (``sales@3``, which a query may name though GetTables lists only the latest
        versions): its name and schema, or None when the name is no version of a dataset (or it is gone)."""
        if VERSIONED.match(table) is None or not self._is_dataset(table):
            return None
        try:
            return table, self._dataset(table).schema
        except FlightpartError:
            return None

    def run(self, query: str, *, limit: int | None = None, parameters: pa.Table | None = None,
            cancelled: Callable[[], bool] = lambda: False, route: Route | None = None, caller: str = "",
            count: Count | None = None) -> pa.Table:
        """``query``'s answer (``limit``: at most that many rows, for a schema). ``parameters``: values for its
        ``?`` (or ``$1``) placeholders, one row per execution, the answers concatenated. ``cancelled``: whether the
        caller gave up (its deadline passed, it hung up): the query is stopped then, not run on for no one.
        ``route``, when given, is told how the query ran, for ``EXPLAIN``. It runs in one of the catalog's
        :attr:`slots`, waiting for one (``BUSY`` when too many wait, or ``caller`` holds its share: :mod:`.slots`).
        ``count(nbytes)`` is told of each batch of the answer as DuckDB produces it, and raises to stop it."""
        with self.slots.held(cancelled, caller):
            return self._run(query, limit=limit, parameters=parameters, cancelled=cancelled, route=route, count=count)

    def _run(self, query: str, *, limit: int | None, parameters: pa.Table | None, cancelled: Callable[[], bool],
             route: Route | None, count: Count | None = None) -> pa.Table:
        duckdb = _duckdb()

        con = self.engine.connect()
        stop = _Watch(con, self.timeout, cancelled)  # a query that runs too long, or for no one, is stopped
        route = route if route is not None else Route()
        failures = ScanFailures()  # what a node's refusal inside DuckDB's scans was, to be raised as itself
        try:
            statements = con.extract_statements(query)
            if len(statements) == 1 and statements[0].type == duckdb.StatementType.EXPLAIN:
                return self._explain(query, schema_only=limit == 0, count=count)
            if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
                raise SqlError("one query is answered here (SELECT, WITH, VALUES, ...), nothing that writes or changes "
                               "settings: nothing was run", field="query")
            refused = refusal(con, query, self._is_dataset)  # DuckDB describing itself, a file: nothing runs
            if refused is not None:
                raise SqlError(refused, field="query")
            named = self._named(query)
            if _lists_tables(query, named):  # SHOW TABLES, information_schema: every dataset, as its columns only
                self._register_listed(con, named, stop)
            wanted = len(statements[0].named_parameters)
            opened: dict[str, Any] = {}  # each dataset opened once for the plans, the scans and the answer's names

            def dataset(name: str) -> Any:
                if name not in opened:
                    opened[name] = self._dataset(name)
                return opened[name]

            written = query
            expected = _as_duckdb_types_it(con, query, named, dataset, failures.scan) \
                if not wanted and limit is None else None
            if expected is not None:  # work the nodes can do: aggregates, first rows, filters

                def aggregated(sql: str) -> pa.Table | None:
                    return _unless_duckdb_refuses(lambda: pushed.answer(sql, set(named), dataset, lambda final, partials,
                                                  joined: _final(con, final, partials, {n: failures.scan(dataset(n))
                                                                                        for n in joined}, count)), failures)

                query = self._answer_parts_first(con, query, named, dataset, route, aggregated, failures)
                done, how = aggregated(query), "aggregate"
                if done is None:  # ORDER BY ... LIMIT: each partition's first rows
                    done, how = _unless_duckdb_refuses(lambda: pushed.answer_top(
                        query, set(named), dataset, lambda final, table, rows: _over(con, final, table, rows, count)),
                        failures), "top"
                if done is not None:
                    route.how, route.query = how, query
                    return _conformed(done, expected)
            route.how, route.query = "scan", query
            for name in named:
                con.register(name, failures.scan(dataset(name)))
            if query != written:  # parts answered first: what is left, named and typed as the query written
                return _conformed(_collected(con.sql(query), count), expected)
            if parameters is None or parameters.num_rows == 0:
                if wanted and limit != 0:
                    raise SqlError(f"the query has {wanted} parameter(s): bind values for them", field="parameters")
                rows = [[None] * wanted]  # a schema: NULLs stand in for the values
            elif parameters.num_columns != wanted:
                raise SqlError(f"the query has {wanted} parameter(s), {parameters.num_columns} were bound",
                               field="parameters")
            else:
                rows = [list(r.values()) for r in parameters.to_pylist()]
            answers = []
            for values in rows:
                relation = con.sql(query, params=values) if wanted else con.sql(query)
                answers.append(_collected(relation.limit(limit) if limit is not None else relation, count))
            return answers[0] if len(answers) == 1 else pa.concat_tables(answers)
        except duckdb.CatalogException as exc:
            message = _one_line(exc)
            if MISSING_TABLE.search(message) is None:  # a function or type DuckDB does not know: the query's mistake
                raise SqlError(message, field="query") from None
            raise DatasetNotFound(self._suggesting_datasets(message), field="query") from None
        except (duckdb.InterruptException, Stopped):
            if stop.gave_up:
                self.abandoned += 1
                log.info("a query was stopped: its caller gave up (deadline passed or call cancelled)")
                raise SqlError("the query was stopped: its caller gave up (its deadline passed)", field="query") from None
            raise QueryTimeout(f"the query ran longer than the {self.timeout:g} s a query may run at the catalog, and "
                               "was stopped", field="query") from None
        except duckdb.OutOfMemoryException as exc:
            failures.raise_first()
            raise self._out_of_memory(exc) from None
        except duckdb.IOException as exc:
            failures.raise_first()
            # external access is off: an I/O error is DuckDB's own files (its spill files), the catalog's failure
            log.warning("DuckDB failed to read or write its own files in a query: %s", exc)
            raise ServerError(f"DuckDB failed with its files at the catalog ({_one_line(exc)}); the catalog's log has "
                              "the details", field="query") from None
        except (duckdb.InternalException, duckdb.FatalException) as exc:
            failures.raise_first()
            # DuckDB failing inside itself is not the query's mistake; its native stack trace stays in the log
            log.warning("DuckDB failed inside a query: %s", exc)
            raise ServerError(f"DuckDB failed inside the query at the catalog ({_one_line(exc)}); the catalog's log has "
                              "the details", field="query") from None
        except duckdb.Error as exc:
            failures.raise_first()  # a node refused or failed a read inside DuckDB's scan: that error, as it was
            raise SqlError(_one_line(exc), field="query") from None
        finally:
            stop.done()
            con.close()

    def _answer_parts_first(self, con: Any, query: str, named: list[str], dataset: Callable[[str], Any],
                            route: Route, aggregated: Callable[[str], pa.Table | None], failures: ScanFailures) -> str:
        """``query`` with its small uncorrelated IN subqueries and its aggregated WITH queries and derived tables
        answered first (:mod:`.inlined`; ``aggregated(sql)``: a query's answer from the nodes' partials, or None),
        so that what is left can run on the nodes; each part is noted in ``route``. A node's failure inside a
        scan (``failures``) ends the query there, not after it is run again whole."""
        duckdb = _duckdb()

        def values(sql: str) -> pa.Table | None:
            try:
                return con.sql(sql).to_arrow_table()
            except duckdb.InterruptException:
                raise
            except duckdb.Error:
                failures.raise_first()
                return None  # it names the outer query's columns (or is wrong, which the whole query will say)

        def table(sql: str, name: str) -> pa.Table | None:
            expected = _as_duckdb_types_it(con, sql, named, dataset, failures.scan)
            answered = aggregated(sql) if expected is not None else None
            if answered is not None:
                answered = _conformed(answered, expected)
                _register_as_duckdb_types_it(con, name, answered, expected)
            return answered

        rewritten, route.first = inlined.inline(query, set(named), values, table, _traffic)
        return rewritten

    def _explain(self, query: str, *, schema_only: bool, count: Count | None = None) -> pa.Table:
        """``EXPLAIN query``: what ran where, and the bytes each part moved (the query is run to measure them, except
        a plain scan, whose partitions go from the nodes to the client)."""
        inner = explained_query(query)
        if inner is None:
            raise SqlError("EXPLAIN is answered as 'EXPLAIN SELECT ...' (comments before it allowed)", field="query")
        if schema_only:
            return frames.empty_table(EXPLAIN_SCHEMA)
        scanned = self.scan(inner)
        if scanned is not None:
            steps = [("read", "nodes", f"{len(scanned[1])} partition(s) sent to the client from the nodes, projected "
                                       "and filtered there (not run here)", None, None)]
            return pa.Table.from_pylist([dict(zip(EXPLAIN_SCHEMA.names, s)) for s in steps], schema=EXPLAIN_SCHEMA)
        before = _traffic()
        route = Route()
        answer = self._run(inner, limit=None, parameters=None, cancelled=lambda: False, route=route,
                           count=count)  # in its slot
        moved = _traffic() - before - sum(part.moved for part in route.first)
        named = set(self._named(inner))
        planned = pushed.plan(route.query, named, self._dataset) if route.how == "aggregate" else None
        top = pushed.top_plan(route.query, named) if route.how == "top" else None
        first = [("first", "catalog (DuckDB)" if part.kind == "values" else "nodes",
                  f"{part.sql}: {part.rows} value(s), put in the query as an IN list" if part.kind == "values" else
                  f"{part.sql}: aggregated on the nodes, {part.rows} row(s) read as a table", part.moved, part.rows)
                 for part in route.first]
        if planned is not None:
            parts = [f"{', '.join(AGGREGATE[f].shown(c) for c, f in aggregates)} "
                     f"by {', '.join(keys) or 'nothing'}" for keys, aggregates in planned.groupings]
            computed = "".join(f", {name} = {text}" for name, text in planned.computed.items())
            what = (f"{planned.table}: partial aggregates " + "; ".join(parts)
                    + (f" where {planned.where}" if planned.where else "") + ", one row per group and partition"
                    + (f"; computing{computed[1:]}" if computed else ""))
            steps = [*first, ("aggregate", "nodes", what, moved, None),
                     ("finish", "catalog (DuckDB)", planned.final, 0, answer.num_rows)]
        elif top is not None:
            name, where, _columns, keys, rows, final = top
            what = (f"{name}: each partition's first {rows} rows by {', '.join(k[0] for k in keys)}"
                    + (f" where {where}" if where else ""))
            steps = [*first, ("top", "nodes", what, moved, None),
                     ("finish", "catalog (DuckDB)", final, 0, answer.num_rows)]
        else:
            names = ", ".join(self._named(route.query))
            scan = [("scan", "nodes", f"{names}: the columns the query uses, and the rows of the filters DuckDB pushed",
                     moved, None)] if names else []
            steps = [*first, *scan, ("query", "catalog (DuckDB)", "everything else: joins, aggregates, ordering", 0,
                                     answer.num_rows)]
        return pa.Table.from_pylist([dict(zip(EXPLAIN_SCHEMA.names, s)) for s in steps], schema=EXPLAIN_SCHEMA)

    def scan(self, query: str) -> tuple[pa.Schema, list[Any]] | None:
        """For a plain scan (:mod:`.scans`), its schema and one endpoint per partition at the nodes; else None."""
        duckdb = _duckdb()

        try:
            with duckdb.connect() as con:  # parsing only: nothing runs, nothing is registered
                statements = con.extract_statements(query)
        except duckdb.Error:
            return None
        if len(statements) != 1 or statements[0].named_parameters or statements[0].type != duckdb.StatementType.SELECT:
            return None
        planned = scans.plain_scan(query, set(self._named(query)))
        if planned is None:
            return None
        name, columns, where = planned
        return scans.endpoints(self._dataset(name), columns, where)

    def schema(self, query: str, caller: str = "") -> pa.Schema:
        """The schema of ``query``'s answer, computed without reading its rows: a plain scan's is the dataset's own
        types, which its nodes send (DuckDB's, announced for it before, named a New York timestamp UTC and a
        string view a string, and the stream then disagreed with what a prepared statement had said)."""
        planned = self.scan(query)
        if planned is not None:
            return planned[0]
        return self.run(query, limit=0, caller=caller).schema

    def _register_listed(self, con: Any, named: list[str], stop: _Watch) -> None:
        """Every dataset ``named`` leaves out, registered with ``con`` as its columns only (an empty table of the types
        DuckDB is shown), for a query that lists tables; one DuckDB cannot describe (a column of a type it cannot
        read: a dense union, which Arrow makes no empty column of either) is left out, not the query's failure."""
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
        """The datasets ``query`` names (as tables), those that exist; others are left for DuckDB to refuse."""
        from sqlglot import exp

        tree = parsed(query)
        if tree is None:
            return []  # DuckDB, which parses it, names the tables it cannot find
        # a WITH query named as a dataset hides it from the rest of the query, not from its own body: registered too
        wanted = {t.name for t in tree.find_all(exp.Table) if t.name and t.db in ("", "main") and not t.catalog}
        known = self._dataset_names()
        named = sorted(n for n in wanted if _names_dataset(n, known))
        folded: dict[str, str] = {}
        for name in named:  # DuckDB's names are one table whatever their case: two datasets would be read as one
            other = folded.setdefault(name.casefold(), name)
            if other != name and _dataset_named(other, known) != _dataset_named(name, known):
                raise SqlError(f"{other!r} and {name!r} are two datasets whose names differ only in case, which SQL "
                               "does not tell apart (DuckDB reads both as one table): query them separately",
                               field="query")
        return named

    def _suggesting_datasets(self, message: str) -> str:
        """DuckDB's message for a table it does not know, its guess kept only when it is a dataset (DuckDB guesses
        from its own system tables too: ``Did you mean "pg_sequences"?``), else the closest dataset's name, else
        ``flightpart ls``."""
        guess, missing = SUGGESTION.search(message), MISSING_TABLE.search(message)
        known = self._dataset_names()
        if guess is not None and (_names_dataset(guess["name"], known)):
            return message
        close = difflib.get_close_matches(missing["name"], sorted(known), n=1) if missing else []
        instead = f' Did you mean "{close[0]}"?' if close else " (`flightpart ls` lists the datasets)"
        if guess is None:
            return message + instead
        return f"{message[:guess.start()].rstrip()}{instead}{message[guess.end():]}"

    def _out_of_memory(self, exc: Exception) -> LimitExceeded:
        """The error of a query that needed more memory, or more spill space on disk, than DuckDB may use for the
        catalog's queries: a limit of the catalog's, not a mistake in the query; DuckDB's own advice (a ``SET`` the
        gateway refuses, fewer threads) is left out for what the client can change."""
        engine = self.engine
        what = (f"more spill space on disk than the {engine.spill:,} bytes the catalog's queries may write together"
                if SPILL_LIMIT in str(exc) else
                f"more memory than the {engine.memory:,} bytes the catalog's queries may use together")
        return LimitExceeded(f"the query needed {what} (the server's limit), and was stopped: aggregate (GROUP BY) or "
                             "filter (WHERE) the rows, or select fewer rows or columns (LIMIT, only the columns "
                             "needed), or retry when fewer queries run", field="query")

    def _dataset_names(self) -> set[str]:
        return {entry["name"] for entry in self.client().list()}

    def _is_dataset(self, table: str) -> bool:
        """Whether a table name means a dataset (``name@version``: a version of one)."""
        return _names_dataset(table, self._dataset_names())

    def _dataset(self, table: str) -> Any:
        """The dataset a table name means (``name@version``: that version), its case as DuckDB's names have it (the
        datasets are listed only when no dataset has that very name)."""
        try:
            return self._opened(table)
        except DatasetNotFound:
            resolved = _dataset_named(table, self._dataset_names())
            if resolved is None or resolved == table:
                raise
            return self._opened(resolved)

    def _opened(self, table: str) -> Any:
        match = VERSIONED.match(table)
        name, version = (match["name"], int(match["version"])) if match else (table, None)
        return self.client().open(name, version)


def _duckdb() -> Any:
    """DuckDB, which answers SQL here; a catalog installed without it (the ``server`` extra) says so."""
    try:
        import duckdb
    except ImportError:
        raise RequestRejected("SQL needs DuckDB where the catalog runs: install flightpart[sql] there",
                              field="query") from None
    return duckdb


def _traffic() -> int:
    """Bytes this process has received from nodes and mapped from their files, so far."""
    counts = TRAFFIC.snapshot()
    return counts["bytes_received"] + counts["bytes_mapped"]


def _as_duckdb_types_it(con: Any, query: str, named: list[str], open_dataset: Callable[[str], Any],
                        scan: Callable[[Any], Any]) -> pa.Schema | None:
    """The schema DuckDB gives ``query``'s answer over the datasets themselves (``count_star()``, a HUGEINT sum),
    found over empty tables of their schemas without reading a row; None when DuckDB refuses the query there (a
    type or binder error), which is then run as written, to fail as DuckDB says. ``scan(dataset)``: the DuckDB
    scan each dataset is registered as again afterwards."""
    duckdb = _duckdb()

    try:
        empty = {name: shown_to_duckdb(open_dataset(name).schema).empty_table() for name in named}
    except pa.ArrowNotImplementedError:  # a type Arrow makes no empty column of (a union): run as written
        return None
    for name in named:
        con.register(name, empty[name])
    try:
        relation = con.sql(query)
        types = relation.limit(0).to_arrow_table().schema.types
    except duckdb.InterruptException:
        raise
    except duckdb.Error:
        return None
    finally:
        for name in named:  # whatever runs next on this connection reads the datasets themselves
            con.register(name, scan(open_dataset(name)))
    schema = pa.schema([pa.field(name, kind) for name, kind in zip(relation.columns, types)])  # names as DuckDB's own
    return schema.with_metadata({b"duckdb_types": "\x1f".join(str(t) for t in relation.types).encode()})


def _register_as_duckdb_types_it(con: Any, name: str, answer: pa.Table, expected: pa.Schema) -> None:
    """``answer`` readable by the rest of the query as ``name``, each column of the type DuckDB gave it (a sum of
    integers is a HUGEINT, which Arrow carries as a decimal128(38, 0) that DuckDB would read back as a DECIMAL)."""
    duckdb = _duckdb()

    kinds = (expected.metadata or {}).get(b"duckdb_types", b"").decode().split("\x1f")
    con.register(f"{name} (arrow)", answer)
    if len(kinds) != answer.num_columns:
        con.register(name, answer)
        return
    columns = ", ".join(f'CAST(#{k + 1} AS {kind})' + f' AS "{c.replace(chr(34), chr(34) * 2)}"'
                        for k, (c, kind) in enumerate(zip(answer.column_names, kinds)))
    quoted = name.replace('"', '""')
    try:
        con.execute(f'CREATE OR REPLACE TEMP VIEW "{quoted}" AS SELECT {columns} FROM "{quoted} (arrow)"')
    except duckdb.Error:
        con.register(name, answer)  # a type DuckDB cannot name back (an ENUM): read as Arrow gives it


def explained_query(query: str) -> str | None:
    """The query an ``EXPLAIN [ANALYZE]`` explains (blanks and comments before it skipped, in one pass: a pattern
    for them would backtrack without end on a row of comments), or None."""
    at = 0
    while at < len(query):
        if query[at].isspace():
            at += 1
        elif query.startswith("--", at):
            end = query.find("\n", at)
            at = len(query) if end < 0 else end + 1
        elif query.startswith("/*", at):
            end = query.find("*/", at + 2)
            if end < 0:
                return None
            at = end + 2
        else:
            break
    match = EXPLAIN.match(query, at)
    return query[match.end():] if match else None


def _unless_duckdb_refuses(answer: Callable[[], pa.Table | None], failures: ScanFailures) -> pa.Table | None:
    """``answer()``, or None when DuckDB refuses the final step over the partials or first rows (a name they do not
    have): the query is then run whole, and any error it has is the one DuckDB gives the query as written. A node's
    failure inside one of its scans (``failures``) is raised instead: the query would only meet it again."""
    duckdb = _duckdb()

    try:
        return answer()
    except duckdb.InterruptException:
        raise
    except duckdb.Error:
        failures.raise_first()
        return None


def _conformed(answer: pa.Table, expected: pa.Schema) -> pa.Table:
    """``answer`` (from partials, or from a query with parts answered first) under the names and types DuckDB gives
    the query as written (see :func:`_as_duckdb_types_it`): a rewritten query is printed anew, which may rename a
    column (``CAST(fare AS TEXT)`` for ``fare::VARCHAR``) or widen a literal's type."""
    if answer.num_columns != len(expected):
        return answer
    answer = answer.rename_columns(expected.names)
    try:
        return answer.cast(expected.remove_metadata())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return answer


def _final(con: Any, query: str, partials: pa.Table, joined: dict[str, Any], count: Count | None) -> pa.Table:
    """What is left of a query once its aggregates are combined: DuckDB over the small table of them (and the
    scans of ``joined``, a join's other side)."""
    con.register(PARTIALS, partials)
    for name, scan in joined.items():
        con.register(name, scan)
    return _collected(con.sql(query), count)


def _over(con: Any, query: str, table: str, rows: pa.Table, count: Count | None) -> pa.Table:
    """``query`` run by DuckDB with ``table`` standing for ``rows`` (the partitions' first rows of a top-N)."""
    con.register(table, rows)
    return _collected(con.sql(query), count)


Count = Callable[[int], None]
"""Told of the bytes of each batch of an answer as DuckDB produces it; raises to stop the answer there."""

DUCKDB_ERRORS = (("INTERRUPT Error", "InterruptException"), ("Out of Memory Error", "OutOfMemoryException"),
                 ("INTERNAL Error", "InternalException"), ("FATAL Error", "FatalException"), ("IO Error", "IOException"))
"""How DuckDB's message starts for the errors the gateway tells apart, and their classes: an error met while an
answer streams reaches Python as Arrow's ``OSError`` holding DuckDB's message only."""


def _collected(relation: Any, count: Count | None) -> pa.Table:
    """``relation``'s rows, read from DuckDB :data:`ANSWER_BATCH_ROWS` at a time, each batch counted (``count``,
    which may raise to stop it) before the next is read; DuckDB's errors as DuckDB raises them."""
    duckdb = _duckdb()
    reader = relation.to_arrow_reader(ANSWER_BATCH_ROWS)
    batches = []
    try:
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except (OSError, pa.ArrowException) as exc:
                text = str(exc)
                kind = next((name for prefix, name in DUCKDB_ERRORS if text.startswith(prefix)), "Error")
                raise getattr(duckdb, kind)(text) from None
            if count is not None:
                count(frames.size_of(batch))
            batches.append(batch)
    finally:
        reader.close()
    return pa.Table.from_batches(batches, schema=reader.schema)


def _names_dataset(table: str, known: set[str]) -> bool:
    """Whether a table name means one of the ``known`` datasets (``name@version``: a version of one)."""
    return _dataset_named(table, known) is not None


def _dataset_named(table: str, known: set[str]) -> str | None:
    """The dataset (and ``@version``) a table name means: the one of that very name, else the one whose name differs
    only in case, as DuckDB matches names (``caseprobe`` had been unknown where ``CaseProbe`` was put); None when
    none, or several, do."""
    match = VERSIONED.match(table)
    name, suffix = (match["name"], table[len(match["name"]):]) if match else (table, "")
    if name in known:
        return name + suffix
    folded = [k for k in known if k.casefold() == name.casefold()]
    return folded[0] + suffix if len(folded) == 1 else None


SUGGESTION = re.compile(r'\s*Did you mean "(?P<name>[^"]*)"\?')
"""DuckDB's guess at a mistyped name, in a CatalogException's message."""
def _lists_tables(query: str, named: list[str]) -> bool:
    """Whether ``query`` lists tables or their columns (``SHOW TABLES``, ``information_schema``) and reads no other
    table than those and the datasets ``named`` (found as it names them): only the datasets a query names are
    registered with DuckDB, so such a query had answered that there was no table. A query that also names a table
    that is no dataset (or two that differ only in case) is run without the listing, so that name is not read as an
    empty stand-in but refused as not found."""
    from sqlglot import exp

    tree = parsed(query)
    if tree is None:
        return False
    if isinstance(tree, exp.Show):
        return True
    tables = list(tree.find_all(exp.Table))
    listing = [t for t in tables if t.db.lower() == "information_schema" and not t.catalog]
    withs = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    others = [t for t in tables if not any(t is seen for seen in listing) and t.name and t.name not in withs]
    return bool(listing) and all(t.name in named and t.db in ("", "main") and not t.catalog for t in others)


MISSING_TABLE = re.compile(r"Table with name (?P<name>.+?) does not exist")


SPILL_LIMIT = "max_temp_directory_size"
"""What DuckDB's out-of-memory error names when its spill files, not its memory, reached their limit."""


def _one_line(exc: BaseException) -> str:
    """DuckDB's message on one line (its caret lines, terminal codes and, for an internal error, its native stack
    trace left out)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).split("Stack Trace:", 1)[0]
    return " ".join(text.split())[:400]


class Stopped(Exception):
    """Work in Python for a query (listing every dataset) stopped by its :class:`_Watch`, as DuckDB's own is."""


class _Watch:
    """Stops a DuckDB query (``interrupt``) once it has run ``timeout`` seconds or its caller gave up, looking
    every :data:`WATCH_SECONDS`, and again at each look after (an interrupt that lands between two of DuckDB's
    statements is lost, and the next would run on); ``gave_up`` says which. :meth:`done` is called before the
    connection is closed:
    once it returns, the watch touches the connection no more (an interrupt racing the close raised in the watch's
    thread, and a native library is not asked to interrupt what it is closing), nor asks whether the caller gave up
    (its call's context is freed once the call ends, and asking it then would read freed memory)."""

    def __init__(self, con: Any, timeout: float, cancelled: Callable[[], bool]):
        self.con, self.timeout, self.cancelled = con, timeout, cancelled
        self.gave_up = False
        self.fired = False  # the query was stopped: what runs in Python between DuckDB's calls stops too
        self._done = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="flightpart-sql-watch", daemon=True).start()

    def _watch(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self._done.wait(WATCH_SECONDS):
            with self._lock:  # the call's context is asked only while its query runs: gRPC frees it after
                if self._done.is_set():
                    return
                gave_up = self.cancelled()
                if gave_up or time.monotonic() > deadline:
                    if not self.fired:
                        self.gave_up = gave_up
                    self.fired = True
                    self.con.interrupt()

    def done(self) -> None:
        with self._lock:
            self._done.set()


WATCH_SECONDS = 0.1
"""How often a running query looks whether its caller is still waiting for it."""
