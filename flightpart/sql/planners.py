"""The ways a query is answered at the catalog: planners tried in order, the first that does not decline answering.

A query the nodes may help with (no parameters, no row limit, typed by DuckDB
over empty tables) first has parts answered (:func:`ready`, :mod:`.inlined`).
Then :data:`PLANNERS`: aggregates on the nodes, first rows on the nodes, the
rest of a rewritten query over the scans, and DuckDB over the scans, which never
declines. A planner of the nodes declines when its plan does not fit or meets
what the nodes cannot express exactly, and the next one tries. Plain scans are
answered as endpoints before any planner (:meth:`~.gateway.Gateway.scan`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import pyarrow as pa

from flightpart.io.transfer import TRAFFIC

from . import inlined, pushed
from .collected import Count, as_duckdb_types_it, collected, conformed, register_as_duckdb_types_it
from .duckdb_errors import SqlError
from .names import lists_tables
from .partials import PARTIALS
from .remembered import ScanFailures
from .schemas import MAX_TEXT, SchemaCache


@dataclass
class Route:
    """How a query ran, for ``EXPLAIN``: ``how`` (the answering :attr:`Planner.how`) for ``query`` as it ran, after its
    ``first`` parts were answered."""

    how: str = "scan"
    query: str = ""
    first: list[inlined.Answered] = field(default_factory=list)


class Bound(NamedTuple):
    """What the caller asked with a query: at most ``limit`` rows (0: its schema), ``parameters`` for its ``wanted``
    placeholders."""

    limit: int | None
    parameters: pa.Table | None
    wanted: int


class Query:
    """A query on its way through the planners, on connection ``con``: ``text`` as it runs, ``written`` as asked, the
    datasets it ``named`` (each opened once); ``expected``: DuckDB's schema for it as written, when the nodes may
    help."""

    def __init__(self, con: Any, text: str, named: list[str], open_dataset: Callable[[str], Any],
                 failures: ScanFailures, count: Count | None, bound: Bound):
        self.con, self.text, self.written, self.named = con, text, text, named
        self.failures, self.count, self.bound = failures, count, bound
        self.expected: pa.Schema | None = None
        self._open, self._opened = open_dataset, {}

    def dataset(self, name: str) -> Any:
        if name not in self._opened:
            self._opened[name] = self._open(name)
        return self._opened[name]

    def register_scans(self) -> None:
        """Each named dataset, registered with DuckDB as its scan."""
        for name in self.named:
            self.con.register(name, self.failures.scan(self.dataset(name)))


class Planner(Protocol):
    """One way a query is answered (see the module doc)."""

    how: str
    """What ``EXPLAIN`` calls the route (:class:`Route`)."""

    def answer(self, query: Query) -> pa.Table | None:
        """``query``'s answer this way, or None: declined."""


def ready(query: Query, route: Route, kept: SchemaCache | None = None) -> None:
    """Set ``query``'s ``expected`` schema when the nodes may help, then answer its parts first (noted in ``route``).
    ``kept``: expected schemas by (text, versions of the datasets named), which a committed version never changes."""
    if query.bound.wanted or query.bound.limit is not None or not query.named:
        return  # parameters, a row limit, or no dataset for the nodes to help with: DuckDB runs the query
    key = None
    if kept is not None and len(query.text) <= MAX_TEXT and not lists_tables(query.text, query.named):
        key = (query.text, tuple((name, query.dataset(name).version) for name in query.named))
    query.expected = kept.get(key) if key is not None and kept is not None else None
    if query.expected is not None:
        query.register_scans()  # as a schema worked out leaves the connection
    else:
        query.expected = as_duckdb_types_it(query.con, query.text, query.named, query.dataset, query.failures.scan)
        if query.expected is not None and key is not None and kept is not None:
            kept.put(key, query.expected)
    if query.expected is not None:
        query.text = _answer_parts_first(query, route)


class AggregatesOnNodes:
    """GROUP BY aggregates over one dataset or a join of two, partials from the nodes finished by DuckDB
    (:mod:`.pushed`)."""

    how = "aggregate"

    def answer(self, query: Query) -> pa.Table | None:
        if query.expected is None:
            return None
        done = aggregated(query, query.text)
        return conformed(done, query.expected) if done is not None else None


class FirstRowsOnNodes:
    """``ORDER BY ... LIMIT``: each partition's first rows from its node, DuckDB running the query over them."""

    how = "top"

    def answer(self, query: Query) -> pa.Table | None:
        if query.expected is None:
            return None
        con, count = query.con, query.count

        def over(final: str, table: str, rows: pa.Table) -> pa.Table:
            con.register(table, rows)
            return collected(con.sql(final), count)

        done = unless_duckdb_refuses(lambda: pushed.answer_top(query.text, set(query.named), query.dataset, over),
                                     query.failures)
        return conformed(done, query.expected) if done is not None else None


class RestOverScans:
    """What is left of a query whose parts were answered first, run over the scans, named and typed as written."""

    how = "scan"

    def answer(self, query: Query) -> pa.Table | None:
        if query.text == query.written:
            return None
        query.register_scans()
        return conformed(collected(query.con.sql(query.text), query.count), query.expected)


class DuckDBOverScans:
    """The query run by DuckDB over the scans, once per row of its parameters; never declines."""

    how = "scan"

    def answer(self, query: Query) -> pa.Table | None:
        query.register_scans()
        limit, parameters, wanted = query.bound
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
            relation = query.con.sql(query.text, params=values) if wanted else query.con.sql(query.text)
            answers.append(collected(relation.limit(limit) if limit is not None else relation, query.count))
        return answers[0] if len(answers) == 1 else pa.concat_tables(answers)


PLANNERS: tuple[Planner, ...] = (AggregatesOnNodes(), FirstRowsOnNodes(), RestOverScans(), DuckDBOverScans())
"""The planners, in the order they are tried (see the module doc)."""


def aggregated(query: Query, sql: str) -> pa.Table | None:
    """``sql`` answered from the nodes' partials (:func:`.pushed.answer`), or None."""
    con, count, failures = query.con, query.count, query.failures

    def final(final: str, partials: pa.Table, joined: tuple[str, ...]) -> pa.Table:
        scans = {name: failures.scan(query.dataset(name)) for name in joined}  # a join's other side
        con.register(PARTIALS, partials)
        for name, scan in scans.items():
            con.register(name, scan)
        return collected(con.sql(final), count)

    return unless_duckdb_refuses(lambda: pushed.answer(sql, set(query.named), query.dataset, final), failures)


def unless_duckdb_refuses(answer: Callable[[], pa.Table | None], failures: ScanFailures) -> pa.Table | None:
    """``answer()``, or None when DuckDB refuses the final step (a name the partials lack): the query then runs whole
    and fails as written. A node's failure inside a scan is raised instead."""
    import duckdb

    try:
        return answer()
    except duckdb.InterruptException:
        raise
    except duckdb.Error:
        failures.raise_first()
        return None


def moved_so_far() -> int:
    """Bytes this process has received from nodes and mapped from their files, so far."""
    counts = TRAFFIC.snapshot()
    return counts["bytes_received"] + counts["bytes_mapped"]


def _answer_parts_first(query: Query, route: Route) -> str:
    """The query with its parts answered first (:mod:`.inlined`), each noted in ``route``; a node's failure inside a
    scan ends the query there."""
    import duckdb

    con, failures = query.con, query.failures

    def values(sql: str) -> pa.Table | None:
        try:
            return con.sql(sql).to_arrow_table()
        except duckdb.InterruptException:
            raise
        except duckdb.Error:
            failures.raise_first()
            return None  # it names the outer query's columns (or is wrong, which the whole query will say)

    def table(sql: str, name: str) -> pa.Table | None:
        expected = as_duckdb_types_it(con, sql, query.named, query.dataset, failures.scan)
        answered = aggregated(query, sql) if expected is not None else None
        if answered is not None:
            answered = conformed(answered, expected)
            register_as_duckdb_types_it(con, name, answered, expected)
        return answered

    rewritten, route.first = inlined.inline(query.text, set(query.named), values, table, moved_so_far)
    return rewritten
