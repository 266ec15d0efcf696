"""What a ticket asks of one partition, done to its table: the one place a filter, a row range, a projection or an
aggregate meets the data, on a node and in a reader mapping a local partition alike."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from flightpart.errors import RequestRejected
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
        table = filters.apply(table, filter)
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


def _slice(table: pa.Table, rows: tuple[int, int]) -> pa.Table:
    """Python slice rules: a range past the end is cut, never an error."""
    start = min(rows[0], table.num_rows)
    return table.slice(start, max(0, min(rows[1], table.num_rows) - start))
