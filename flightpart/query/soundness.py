"""Whether a table another process streamed is safe to compute on.

pyarrow's stream reader checks next to nothing: not even buffer sizes
against the rows a batch claims. A node that lies (a faulty or hostile one)
can send a batch longer than its buffers, string or list offsets past their
data, dictionary indices past their dictionary or views past their buffers, and every Arrow kernel, DuckDB scan or Polars conversion
that then reads them reads out of bounds and may kill the process that does:
a reader, the SQL gateway inside the catalog, a node assembling a
repartition. :func:`unsound` is the check each of them makes on what it
receives, before anything reads it.

Every column's layout (buffer sizes against the rows, child arrays) is
checked in one call for the whole table. Every other column then gets
Arrow's full validation, one column at a time: columns whose values point
somewhere (offsets, dictionary indices, views, union type codes, run
ends), and decimals, ``date64`` and times of day, whose values Arrow
checks too. Numbers, booleans, fixed-size binary, ``date32``, timestamps,
durations and intervals need nothing more: for them Arrow's full
validation is the layout check. Text columns are checked as the bytes they are
(offsets in bounds and in order), not for UTF-8: that is memory safety at
about 8 GB/s of offsets, where Arrow's full validation of text runs at
about 3 GB/s of characters (a 945 MiB read with one text column: 12 ms
against 40 ms).

Each column validated from Python is a step of Python: a table of 2,000
numeric columns is checked in 1.0 ms this way, where one call per column
took 2.5 ms (four numbers and a text column: 4.8 µs against 6.9 µs).
"""

from __future__ import annotations

import pyarrow as pa

AS_BYTES = {pa.string().id: pa.binary(), pa.large_string().id: pa.large_binary(), pa.string_view().id: pa.binary_view()}
"""Text types (by type id) and the byte types of the same layout, whose full validation does not decode UTF-8."""

VIEWED_CHUNKS = 8
"""A text column of at most this many chunks is checked chunk by chunk, each viewed as bytes; a longer one is cast
whole. A read of a small partition pays for each step of Python in it, with its caches cold more often than not
(a cast dispatches through the compute registry, some 0.13 ms cold where a view takes 0.01 ms); a large one pays
per chunk."""


LAYOUT_ONLY = frozenset(pa.lib.__dict__[name] for name in (
    "Type_NA", "Type_BOOL", "Type_UINT8", "Type_INT8", "Type_UINT16", "Type_INT16", "Type_UINT32", "Type_INT32",
    "Type_UINT64", "Type_INT64", "Type_HALF_FLOAT", "Type_FLOAT", "Type_DOUBLE", "Type_FIXED_SIZE_BINARY",
    "Type_DATE32", "Type_TIMESTAMP", "Type_INTERVAL_MONTHS", "Type_INTERVAL_DAY_TIME", "Type_INTERVAL_MONTH_DAY_NANO",
    "Type_DURATION"))
"""Type ids of columns whose full validation is their layout check: Arrow checks no value of theirs. (Decimals,
``date64`` and times of day are not here: their full validation checks each value, a decimal past its precision
being a wrong number that partial aggregates must not hand on, see :mod:`flightpart.query.aggregates`.)"""


def unsound(table: pa.Table) -> str | None:
    """Why ``table`` cannot be read safely (the first column that is not, and what Arrow found), or None."""
    try:
        table.validate()  # every column's layout, in one call
    except pa.ArrowException as exc:
        return _first_misshapen(table) or str(exc)[:200]
    for k, field in enumerate(table.schema):
        kind = field.type.id  # by id: a type's hash formats its name
        if kind in LAYOUT_ONLY:
            continue
        column = table.column(k)
        as_bytes = AS_BYTES.get(kind)
        try:
            if as_bytes is None:
                column.validate(full=True)
            elif column.num_chunks <= VIEWED_CHUNKS:
                for chunk in column.chunks:
                    chunk.view(as_bytes).validate(full=True)
            else:
                column.cast(as_bytes).validate(full=True)
        except pa.ArrowException as exc:  # invalid, an index out of bounds, a layout it cannot check
            return f"column {field.name!r}: {str(exc)[:200]}"
    return None


def _first_misshapen(table: pa.Table) -> str | None:
    """The first column whose layout is wrong, named, and what Arrow found (after the table as a whole failed)."""
    for k in range(table.num_columns):
        try:
            table.column(k).validate()
        except pa.ArrowException as exc:
            return f"column {table.schema.names[k]!r}: {str(exc)[:200]}"
    return None
