"""``EXPLAIN``: what ran where for a query, and the bytes each part moved, one row per part of the work.

The query is run (but a plain scan) and its route (:class:`~.planners.Route`)
told as steps.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from flightpart.query.functions import AGGREGATE

from . import pushed
from .planners import Route

EXPLAIN = re.compile(r"explain(\s+analyze)?\s+", re.IGNORECASE)
EXPLAIN_SCHEMA = pa.schema([("step", pa.utf8()), ("where", pa.utf8()), ("what", pa.utf8()), ("bytes_moved", pa.int64()),
                            ("rows", pa.int64())])
"""What ``EXPLAIN`` answers: one row per part of the work."""


def explained_query(query: str) -> str | None:
    """The query an ``EXPLAIN [ANALYZE]`` explains, or None; blanks and comments before it skipped in one linear pass
    (decision 0034)."""
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


def scan_explained(partitions: int) -> pa.Table:
    """A plain scan's ``EXPLAIN``: its ``partitions`` go from the nodes to the client."""
    steps = [("read", "nodes", f"{partitions} partition(s) sent to the client from the nodes, projected "
                               "and filtered there (not run here)", None, None)]
    return _table(steps)


def explained(route: Route, rows: int, moved: int, named: set[str], open_dataset: Callable[[str], Any],
              names_in: Callable[[str], list[str]]) -> pa.Table:
    """The steps of a query that ran by ``route`` to ``rows`` rows, the nodes having moved ``moved`` bytes; ``named``:
    the datasets it names, ``names_in(sql)`` those ``sql`` names."""
    first = [("first", "catalog (DuckDB)" if part.kind == "values" else "nodes",
              f"{part.sql}: {part.rows} value(s), put in the query as an IN list" if part.kind == "values" else
              f"{part.sql}: aggregated on the nodes, {part.rows} row(s) read as a table", part.moved, part.rows)
             for part in route.first]
    planned = pushed.plan(route.query, named, open_dataset) if route.how == "aggregate" else None
    top = pushed.top_plan(route.query, named) if route.how == "top" else None
    if planned is not None:
        parts = [f"{', '.join(AGGREGATE[f].shown(c) for c, f in aggregates)} "
                 f"by {', '.join(keys) or 'nothing'}" for keys, aggregates in planned.groupings]
        computed = "".join(f", {name} = {text}" for name, text in planned.computed.items())
        what = (f"{planned.table}: partial aggregates " + "; ".join(parts)
                + (f" where {planned.where}" if planned.where else "") + ", one row per group and partition"
                + (f"; computing{computed[1:]}" if computed else ""))
        return _table([*first, ("aggregate", "nodes", what, moved, None),
                       ("finish", "catalog (DuckDB)", planned.final, 0, rows)])
    if top is not None:
        name, where, _columns, keys, kept, final = top
        what = (f"{name}: each partition's first {kept} rows by {', '.join(k[0] for k in keys)}"
                + (f" where {where}" if where else ""))
        return _table([*first, ("top", "nodes", what, moved, None), ("finish", "catalog (DuckDB)", final, 0, rows)])
    names = ", ".join(names_in(route.query))
    scan = [("scan", "nodes", f"{names}: the columns the query uses, and the rows of the filters DuckDB pushed",
             moved, None)] if names else []
    return _table([*first, *scan,
                   ("query", "catalog (DuckDB)", "everything else: joins, aggregates, ordering", 0, rows)])


def _table(steps: list[tuple]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(EXPLAIN_SCHEMA.names, s)) for s in steps], schema=EXPLAIN_SCHEMA)
