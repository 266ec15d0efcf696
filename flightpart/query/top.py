"""The first rows by sort keys (``ORDER BY ... LIMIT``), computed next to the data.

Each partition keeps its own first ``limit`` rows by the keys; the reader
keeps the first ``limit`` of what all partitions sent. A partition also
sends every row whose floating-point key is NaN: Arrow sorts NaN beside the
nulls, DuckDB ranks it above every number, and keeping those rows makes what
a partition sends a superset of its share of the answer under either rule
(tables rarely hold NaN, so it costs nothing in practice).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from flightpart.errors import RequestRejected
from flightpart.wire import SortKey, TopRows

ORDERS = {"ascending": False, "descending": True}
PLACEMENTS = {"at_end": False, "at_start": True}


def spec(limit: int, by: Any, names: Sequence[str]) -> TopRows:
    """A :class:`TopRows` from pyarrow-style sort keys: ``"col"``, ``("col", "descending")`` or
    ``("col", "descending", "at_start")``, one or a list; ValueError naming what is wrong."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ValueError(f"top: limit must be a non-negative integer, got {limit!r}")
    items = [by] if isinstance(by, (str, tuple)) else list(by)
    if not items:
        raise ValueError("top: name at least one column to order by")
    keys = []
    for item in items:
        if isinstance(item, str):
            column, order, placement = item, "ascending", "at_end"
        elif isinstance(item, tuple) and len(item) in (2, 3):
            column, order, placement = (*item, "at_end")[:3]
        else:
            raise ValueError(f"top: expected 'column' or ('column', order[, null placement]), got {item!r}")
        if column not in names:
            raise ValueError(f"top: unknown column {column!r}; the view has {list(names)}")
        if order not in ORDERS or placement not in PLACEMENTS:
            raise ValueError(f"top: expected ('column', 'ascending'|'descending'[, 'at_start'|'at_end']), got {item!r}")
        keys.append(SortKey(column, ORDERS[order], PLACEMENTS[placement]))
    return TopRows(tuple(keys), limit)


def sort_keys(top: TopRows) -> list[tuple[str, str, str]]:
    """The keys as pyarrow's ``sort_keys``."""
    return [(k.column, "descending" if k.descending else "ascending", "at_start" if k.nulls_first else "at_end")
            for k in top.keys]


def candidates(table: pa.Table, top: TopRows) -> pa.Table:
    """What one partition sends: its first ``top.limit`` rows by the keys, and every row with a NaN key."""
    unknown = [k.column for k in top.keys if k.column not in table.column_names]
    if unknown:
        raise RequestRejected(f"ticket.top: unknown column {unknown[0]!r}; the partition has {table.column_names}",
                              field="ticket.top")
    if table.num_rows <= top.limit:
        return table
    chosen = pc.select_k_unstable(table, top.limit, sort_keys=sort_keys(top)) if top.limit else pa.array([], pa.uint64())
    nan = None
    for key in top.keys:
        column = table.column(key.column)
        if pa.types.is_floating(column.type):
            found = pc.fill_null(pc.is_nan(column), False)
            nan = found if nan is None else pc.or_(nan, found)
    if nan is not None and pc.any(nan).as_py():
        chosen = pc.unique(pa.concat_arrays([chosen.cast(pa.uint64()),
                                             pc.indices_nonzero(nan).cast(pa.uint64())]))
    return table.take(chosen)


def first(table: pa.Table, top: TopRows) -> pa.Table:
    """The first ``top.limit`` rows of ``table`` by the keys, in order (as ``table.sort_by(keys)[:limit]``)."""
    return table.take(pc.sort_indices(table, sort_keys=sort_keys(top))[:top.limit])
