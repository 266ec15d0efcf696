"""Whether a table another process streamed is safe to compute on.

pyarrow's stream reader checks next to nothing: not even buffer sizes
against the rows a batch claims. A node that lies (a faulty or hostile one)
can send a batch longer than its buffers, string or list offsets past their
data, dictionary indices past their dictionary or views past their buffers, and every Arrow kernel, DuckDB scan or Polars conversion
that then reads them reads out of bounds and may kill the process that does:
a reader, the SQL gateway inside the catalog, a node assembling a
repartition. :func:`unsound` is the check each of them makes on what it
receives, before anything reads it.

Text columns are checked as the bytes they are (offsets in bounds and in
order), not for UTF-8: that is memory safety at about 8 GB/s of offsets,
where Arrow's full validation of text runs at about 3 GB/s of characters
(a 945 MiB read with one text column: 12 ms against 40 ms). Every other
column gets Arrow's full validation, which for fixed-width values without
a dictionary costs nothing per value (buffer sizes against the rows) but
one count of the validity bitmap where there is one. That count is why a
fixed-width column is not left to the cheap check of its layout: the
declared null count is trusted by pyarrow's quantile and sort kernels, its
Parquet writer and Polars' sort and rank, which sized buffers from a lying
one and were killed by it; only full validation compares the two.
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


def unsound(table: pa.Table) -> str | None:
    """Why ``table`` cannot be read safely (the first column that is not, and what Arrow found), or None."""
    for k in range(table.num_columns):
        column = table.column(k)
        as_bytes = AS_BYTES.get(column.type.id)  # by id: a type's hash formats its name
        try:
            if as_bytes is None:
                column.validate(full=True)
            elif column.num_chunks <= VIEWED_CHUNKS:
                for chunk in column.chunks:
                    chunk.view(as_bytes).validate(full=True)
            else:
                column.cast(as_bytes).validate(full=True)
        except pa.ArrowException as exc:  # invalid, an index out of bounds, a layout it cannot check
            return f"column {table.schema.names[k]!r}: {str(exc)[:200]}"
    return None
