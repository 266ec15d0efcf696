"""Whether a table another process streamed is safe to compute on.

pyarrow's stream reader checks only what costs nothing: buffer sizes against
lengths. A node that lies (a faulty or hostile one) can send string or list
offsets past their data, dictionary indices past their dictionary or views
past their buffers, and every Arrow kernel, DuckDB scan or Polars conversion
that then reads them reads out of bounds and may kill the process that does:
a reader, the SQL gateway inside the catalog, a node assembling a
repartition. :func:`unsound` is the check each of them makes on what it
receives, before anything reads it.

Text columns are checked as the bytes they are (offsets in bounds and in
order), not for UTF-8: that is memory safety at about 8 GB/s of offsets,
where Arrow's full validation of text runs at about 3 GB/s of characters
(a 945 MiB read with one text column: 12 ms against 40 ms). Every other
column gets Arrow's full validation, which for fixed-width values without
a dictionary costs nothing per value.
"""

from __future__ import annotations

import pyarrow as pa

AS_BYTES = {pa.string(): pa.binary(), pa.large_string(): pa.large_binary(), pa.string_view(): pa.binary_view()}
"""Text types and the byte types of the same layout, whose full validation does not decode UTF-8."""


def unsound(table: pa.Table) -> str | None:
    """Why ``table`` cannot be read safely (the first column that is not, and what Arrow found), or None."""
    for name, column in zip(table.column_names, table.columns):
        as_bytes = AS_BYTES.get(column.type)
        try:
            (column if as_bytes is None else column.cast(as_bytes)).validate(full=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            return f"column {name!r}: {str(exc)[:200]}"
    return None
