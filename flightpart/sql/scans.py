"""Plain scans answered from the nodes: ``SELECT a, b FROM t WHERE ...`` has one endpoint per partition.

Its FlightInfo lists one endpoint per partition that may match, at its replicas,
so the client reads them in parallel from the nodes. Anything more than picking
columns and filtering rows flightpart expresses is answered at the catalog.
"""

from __future__ import annotations

import functools
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import FlightpartError
from flightpart.wire import EndpointRows

from .parsed import KEPT, KEPT_TEXT, parsed_to_read
from .partials import unplannable


def plain_scan(query: str, known: set[str]) -> tuple[str, list[str] | None, str | None] | None:
    """(table, its columns or None for ``*``, the WHERE text) of a plain scan of one of the ``known`` datasets, or None
    for any other query."""
    shape = _scan_shape(query) if len(query) <= KEPT_TEXT else _shape(query)
    if shape is None or shape[0] not in known:
        return None
    return shape[0], None if shape[1] is None else list(shape[1]), shape[2]


@functools.lru_cache(maxsize=KEPT)
def _scan_shape(query: str) -> tuple[str, tuple[str, ...] | None, str | None] | None:
    """:func:`_shape`, kept per text (a query is asked whether it is a plain scan as it is prepared and again as it
    runs)."""
    return _shape(query)


def _shape(query: str) -> tuple[str, tuple[str, ...] | None, str | None] | None:
    """(table, its columns or None for ``*``, the WHERE text) when ``query`` has the shape of a plain scan of a table,
    else None."""
    from sqlglot import exp

    tree = parsed_to_read(query)
    if tree is None:
        return None
    if not isinstance(tree, exp.Select) or tree.find(exp.Window, exp.Subquery, exp.AggFunc) is not None \
            or unplannable(tree):
        return None
    if any(tree.args.get(k) or tree.args.get(f"{k}_")
           for k in ("joins", "distinct", "group", "having", "order", "limit", "offset", "qualify", "with")):
        return None
    source = tree.args.get("from") or tree.args.get("from_")
    table = source.this if source is not None else None
    if not isinstance(table, exp.Table) or table.db or table.alias or not table.name:
        return None
    picked = tree.expressions
    if len(picked) == 1 and isinstance(picked[0], exp.Star):
        columns = None
    elif all(isinstance(e, exp.Column) and e.table in ("", table.name) for e in picked):
        columns = tuple(e.name for e in picked)
        if len(set(columns)) != len(columns):
            return None
    else:
        return None
    where = tree.args.get("where")
    return table.name, columns, where.this.sql(dialect="duckdb") if where is not None else None


def endpoints(ds: Any, columns: list[str] | None, where: str | None
              ) -> tuple[pa.Schema, list[flight.FlightEndpoint]] | None:
    """A plain scan of ``ds`` as (schema, one endpoint per partition that may match), or None when the nodes cannot send
    it as asked."""
    plan = ds.plan
    if plan.grid[1] != 1 or plan.data_names() != set(ds.schema.names):
        return None
    try:
        view = ds.select(columns) if columns is not None else ds
        view = view.filter(where) if where is not None else view
    except (FlightpartError, KeyError):
        return None
    blocks = view.plan.blocks(_uncounted, counted=False)
    refs = [view.plan.ref(b, 0, view.plan.columns_of(0)) for b in blocks]
    return view.schema, [flight.FlightEndpoint(ref.ticket(), [uri for uri, _ip, _pid in ref.replicas],
                                               app_metadata=_rows_of(ref)) for ref in refs]


def _rows_of(ref: Any) -> bytes:
    """The endpoint's :class:`~flightpart.wire.EndpointRows` (empty when the catalog does not know them)."""
    return b"" if ref.most_rows is None else EndpointRows(ref.most_rows, ref.most_bytes or None).encode()


def _uncounted(blocks: list) -> dict[int, int]:  # pragma: no cover - blocks(counted=False) never counts
    raise AssertionError("a plain scan does not count rows")
