"""The first rows by sort keys (``ORDER BY ... LIMIT``), computed next to the data.

Each partition keeps its first ``limit`` rows by the keys and the reader the first ``limit`` of all they sent.
A partition also sends every row whose float key is NaN: Arrow sorts NaN beside nulls, DuckDB above every number,
so what it sends holds its share of the answer under either rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightpart import frames
from flightpart.errors import RequestRejected, ServerError
from flightpart.frames import schema_without_views, take_rows
from flightpart.wire import SortKey, TopRows

from .soundness import unsound

ORDERS = {"ascending": False, "descending": True}
PLACEMENTS = {"at_end": False, "at_start": True}


def spec(limit: int, by: Any, schema: pa.Schema) -> TopRows:
    """A :class:`TopRows` from pyarrow-style sort keys (``"col"``, ``("col", "descending")``,
    ``("col", "descending", "at_start")``, one or a list) over ``schema``; ValueError naming a bad column
    (:func:`orderable`)."""
    names = schema.names
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
        column_type = schema.field(names.index(column)).type
        if not orderable(column_type):
            raise ValueError(f"top: rows cannot be ordered by {column!r}, a column of {column_type}")
        if order not in ORDERS or placement not in PLACEMENTS:
            raise ValueError(f"top: expected ('column', 'ascending'|'descending'[, 'at_start'|'at_end']), got {item!r}")
        keys.append(SortKey(column, ORDERS[order], PLACEMENTS[placement]))
    return TopRows(tuple(keys), limit)


def orderable(data_type: pa.DataType) -> bool:
    """Whether rows can be ordered by a key of ``data_type`` (a dictionary's by its values): numbers, booleans,
    decimals, dates and times, text and bytes, as in DuckDB and Polars. Checked before pyarrow sees a key, since
    ``select_k_unstable`` crashes on keys it cannot order."""
    if pa.types.is_dictionary(data_type):
        data_type = data_type.value_type
    t = pa.types
    return (t.is_null(data_type) or t.is_boolean(data_type) or t.is_integer(data_type)
            or (t.is_floating(data_type) and not t.is_float16(data_type))
            or isinstance(data_type, (pa.Decimal128Type, pa.Decimal256Type))
            or (t.is_temporal(data_type) and not t.is_interval(data_type))
            or t.is_string(data_type) or t.is_large_string(data_type) or t.is_binary(data_type)
            or t.is_large_binary(data_type) or t.is_fixed_size_binary(data_type)
            or t.is_string_view(data_type) or t.is_binary_view(data_type))  # ordered as their strings (:func:`_keys`)


def _checked(table: pa.Table, top: TopRows, where: str) -> list[pa.ChunkedArray]:
    """The sort keys' columns of ``table``; RequestRejected for one missing or unorderable."""
    columns = []
    for key in top.keys:
        if key.column not in table.column_names:
            raise RequestRejected(f"{where}: unknown column {key.column!r}; the partition has {table.column_names}",
                                  field=where)
        column = table.column(key.column)
        if not orderable(column.type):
            raise RequestRejected(f"{where}: rows cannot be ordered by {key.column!r}, a column of {column.type}",
                                  field=where)
        columns.append(column)
    return columns


def _keys(columns: list[pa.ChunkedArray], top: TopRows) -> tuple[pa.Table, list[tuple[str, str, str]]]:
    """The key columns as a table of their own (``k0``, ``k1``, …), dictionaries decoded, and ``sort_keys`` over it."""
    names = [f"k{i}" for i in range(len(columns))]
    order = [(name, "descending" if k.descending else "ascending", "at_start" if k.nulls_first else "at_end")
             for name, k in zip(names, top.keys)]
    decoded = [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in columns]
    keys = pa.table(decoded, names=names)
    plain = schema_without_views(keys.schema)  # no sort kernel takes a string view: ordered as its strings
    return (keys if plain is None else keys.cast(plain)), order


def candidates(table: pa.Table, top: TopRows) -> pa.Table:
    """What one partition sends: its first ``top.limit`` rows by the keys, and every row with a NaN key."""
    columns = _checked(table, top, "ticket.top")
    if table.num_rows <= top.limit:
        return table
    kept = _past_the_first_key(columns[0], top)
    if kept is not None:
        table = _taken(table, kept)
        columns = [table.column(key.column) for key in top.keys]
        if table.num_rows <= top.limit:
            return table
    keys, order = _keys(columns, top)
    chosen = pc.select_k_unstable(keys, top.limit, sort_keys=order) if top.limit else pa.array([], pa.uint64())
    nan = None
    for column in keys.columns:
        if pa.types.is_floating(column.type):
            found = pc.fill_null(pc.is_nan(column), False)
            nan = found if nan is None else pc.or_(nan, found)
    if nan is not None and pc.any(nan).as_py():
        chosen = pc.unique(pa.concat_arrays([chosen.cast(pa.uint64()),
                                             pc.indices_nonzero(nan).cast(pa.uint64())]))
    return _taken(table, chosen)


PREFILTER_ROWS = 4096
"""A partition of more rows is first cut to the rows not behind its ``limit``-th first key
(:func:`_past_the_first_key`): a NumPy partition of a column is much cheaper than Arrow's select_k over every
row."""


def _past_the_first_key(column: pa.ChunkedArray, top: TopRows) -> pa.Array | None:
    """The positions (ascending) of the rows whose first key is not behind the ``limit``-th first key, when the key
    is numbers or times without nulls or NaN (NumPy orders them as DuckDB does) and the partition is large; else None.

    Why it is correct: a row whose first key is strictly behind the ``limit``-th is behind at least ``limit`` rows
    whatever the other keys say; rows tied with it are all kept for the other keys to order."""
    if len(column) <= max(PREFILTER_ROWS, top.limit) or top.limit == 0 or column.null_count:
        return None
    kind = column.type
    if pa.types.is_timestamp(kind) or pa.types.is_date64(kind) or pa.types.is_duration(kind) \
            or pa.types.is_time64(kind):
        column = pa.chunked_array([c.view(pa.int64()) for c in column.chunks], pa.int64())
    elif pa.types.is_date32(kind) or pa.types.is_time32(kind):
        column = pa.chunked_array([c.view(pa.int32()) for c in column.chunks], pa.int32())
    elif not (pa.types.is_integer(kind) or pa.types.is_floating(kind)) or pa.types.is_float16(kind):
        return None
    values = column.to_numpy()
    if values.dtype.kind == "f" and np.isnan(values).any():
        return None
    k = top.limit
    if top.keys[0].descending:
        kept = values >= np.partition(values, len(values) - k)[len(values) - k]
    else:
        kept = values <= np.partition(values, k - 1)[k - 1]
    return pa.array(np.flatnonzero(kept))


def checked_candidates(parts: list[pa.Table], schema: pa.Schema) -> pa.Table:
    """What the nodes sent for a top, as one table; ServerError for columns or types other than ``schema``'s or
    invalid Arrow (which a sort would read out of bounds)."""
    for part in parts:
        if part.schema.names != schema.names or part.schema.types != schema.types:
            raise ServerError(f"a node's top rows ({', '.join(map(str, part.schema))[:200]}) are not of the "
                              f"view's columns and types ({', '.join(map(str, schema))[:200]}); not used")
    table = pa.concat_tables(parts) if parts else frames.empty_table(schema)
    why = unsound(table)
    if why is not None:
        raise ServerError(f"a node's top rows are not valid Arrow ({why}); not used")
    return table


def first(table: pa.Table, top: TopRows) -> pa.Table:
    """The first ``top.limit`` rows of ``table`` by the keys, in order (as ``table.sort_by(keys)[:limit]``)."""
    keys, order = _keys(_checked(table, top, "top"), top)
    return _taken(table, pc.sort_indices(keys, sort_keys=order)[:top.limit])


def _taken(table: pa.Table, indices: pa.Array) -> pa.Table:
    """``table.take(indices)`` (view columns too; a dictionary column with null dictionary values re-encoded)."""
    try:
        return take_rows(table, indices)
    except pa.ArrowInvalid:
        columns = []
        for field, column in zip(table.schema, table.columns):
            if pa.types.is_dictionary(column.type) and column.num_chunks > 1:
                values = column.cast(column.type.value_type).take(indices)
                columns.append(pc.dictionary_encode(values).cast(column.type))
            else:
                columns.append(take_rows(pa.table([column], schema=pa.schema([field])), indices).column(0))
        return pa.table(columns, schema=table.schema)
