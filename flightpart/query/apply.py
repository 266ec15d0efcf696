"""What a ticket asks of one partition, done to its table: the one place a filter, a row range, a projection or an
aggregate meets the data, on a node and in a reader mapping a local partition alike."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from flightpart.errors import FlightpartError, RequestRejected
from flightpart.wire import ROW_NUMBER, Aggregate, TopRows

from . import aggregates, filters
from . import top as first_rows


def apply_ticket(table: pa.Table, columns: tuple[str, ...] | None, rows: tuple[int, int] | None,
                 filter: bytes | None = None,
            matched: tuple[int, int] | None = None, aggregate: Aggregate | None = None, row_numbers: bool = False,
            top: TopRows | None = None) -> pa.Table:
    """What a ticket asks of a partition, in the ticket's order: a row range, row numbers, a filter, a range of the
    rows kept, first rows by sort keys, a projection, an aggregate. Without a filter, first rows or an aggregate,
    every step is a zero-copy slice."""
    first = 0
    if rows is not None:
        first = min(rows[0], table.num_rows)
        table = _slice(table, rows)
    if row_numbers:
        table = table.append_column(ROW_NUMBER, pa.array(np.arange(first, first + table.num_rows, dtype=np.int64)))
    if filter is not None:
        table = filters.apply(table, filter, keep=_read_after_filter(table.schema, columns, aggregate, top,
                                                                     row_numbers))
    if matched is not None:
        table = _slice(table, matched)
    if top is not None:
        table = first_rows.candidates(table, top)
    if aggregate is not None:
        return aggregates.partial(table, aggregate)
    if columns is not None:
        unknown = [c for c in columns if c not in table.column_names]
        if unknown:
            raise RequestRejected(f"ticket.columns: unknown column {unknown[0]!r}; the partition has "
                                  f"{table.column_names}",
                                  field="ticket.columns")
        table = table.select(list(columns) + ([ROW_NUMBER] if row_numbers else []))
    return table


def _read_after_filter(schema: pa.Schema, columns: tuple[str, ...] | None, aggregate: Aggregate | None,
                       top: TopRows | None, row_numbers: bool) -> set[str] | None:
    """The columns the steps after a filter read (None: every one), so the filter copies only the rows of those: an
    aggregate's, or the projection's and the first rows' keys. A column the steps name and the partition lacks is
    left for them to refuse."""
    if aggregate is not None:
        try:  # (a computed column's name too: one named like a stored column is refused by the aggregate step)
            needed = {*aggregates.columns_read(aggregate, schema), *(name for name, _ in aggregate.computed or ())}
        except (FlightpartError, KeyError):  # a computed column that does not parse: the aggregate step refuses it
            return None
    elif columns is not None:
        needed = {*columns, *(key.column for key in (top.keys if top is not None else ()))}
    else:
        return None
    return needed | {ROW_NUMBER} if row_numbers else needed


def _slice(table: pa.Table, rows: tuple[int, int]) -> pa.Table:
    """Python slice rules: a range past the end is cut, never an error."""
    start = min(rows[0], table.num_rows)
    return table.slice(start, max(0, min(rows[1], table.num_rows) - start))
