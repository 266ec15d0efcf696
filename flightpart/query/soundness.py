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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

AS_BYTES = {pa.string().id: pa.binary(), pa.large_string().id: pa.large_binary(), pa.string_view().id: pa.binary_view()}
"""Text types (by type id) and the byte types of the same layout, whose full validation does not decode UTF-8."""

DECIMAL_BYTES = {pa.decimal128(38, 0).id: 16, pa.decimal256(76, 0).id: 32}
"""Decimal types (by type id) and their widths where the most negative number of the width, which fits no
precision of it, passes Arrow's full validation (its precision check takes the value's absolute value, which
overflows there; 32- and 64-bit decimals are caught). DuckDB, asked to cast one to text, failed with an internal
error that invalidated its database."""

_ONE_CHILD = frozenset(kind.id for kind in (
    pa.list_(pa.int8()), pa.large_list(pa.int8()), pa.list_(pa.int8(), 1), pa.list_view(pa.int8()),
    pa.large_list_view(pa.int8()), pa.dictionary(pa.int8(), pa.int8()), pa.run_end_encoded(pa.int32(), pa.int8())))
"""Nested types (by type id) whose values are of one type, their ``value_type``."""
_EXTENSION = pa.uuid().id
NESTED = _ONE_CHILD | {kind.id for kind in (pa.struct([]), pa.map_(pa.int8(), pa.int8()), pa.dense_union([]),
                                            pa.sparse_union([]))} | {_EXTENSION}
"""Types (by type id) that hold values of other types (an extension type its storage), where a decimal at its width's floor can hide as deep as it
likes: DuckDB, asked to cast a list or a struct of one to text, failed inside itself and invalidated the caller's
database as it did for a plain column. Each read walks its nested columns' types (:func:`holds_decimal`, some
2 µs a column); flat columns pay one set lookup."""


VIEWED_CHUNKS = 8
"""A text column of at most this many chunks is checked chunk by chunk, each viewed as bytes; a longer one is cast
whole. A read of a small partition pays for each step of Python in it, with its caches cold more often than not
(a cast dispatches through the compute registry, some 0.13 ms cold where a view takes 0.01 ms); a large one pays
per chunk."""


def unsound(table: pa.Table) -> str | None:
    """Why ``table`` cannot be read safely (the first column that is not, and what Arrow found), or None."""
    for k in range(table.num_columns):
        column = table.column(k)
        kind = column.type.id  # by id: a type's hash formats its name
        as_bytes = AS_BYTES.get(kind)
        try:
            if as_bytes is None:
                column.validate(full=True)
                if kind in DECIMAL_BYTES or kind in NESTED:  # no call per column for the others: a small read
                    decimal_past_precision(column)          # pays for each
            elif column.num_chunks <= VIEWED_CHUNKS:
                for chunk in column.chunks:
                    chunk.view(as_bytes).validate(full=True)
            else:
                column.cast(as_bytes).validate(full=True)
        except pa.ArrowException as exc:  # invalid, an index out of bounds, a layout it cannot check
            return f"column {table.schema.names[k]!r}: {str(exc)[:200]}"
    return None


def decimal_past_precision(array: pa.Array | pa.ChunkedArray) -> None:
    """Raise ArrowInvalid when a decimal array (or any chunk of a column, or any decimal a nested array holds at any
    depth) holds its width's most negative number (see :data:`DECIMAL_BYTES`), which Arrow's full validation misses;
    any other value past the precision it finds itself, so the two together are a decimal's whole check. Null slots
    are not values and are not looked at. One pass of numpy over the values: only decimal columns (and nested ones
    holding decimals) pay for it, any other is returned from at once. A list's values, a dictionary, a run-end
    encoded array's values and a dense union's children are checked whole, rows their parent does not reach
    included (no honest writer puts that value anywhere); a struct's and a sparse union's children as the rows of
    their parent."""
    if holds_decimal(array.type):  # the type walked once, not again at each level or chunk below
        _floor_in(array)


def _floor_in(array: pa.Array | pa.ChunkedArray) -> None:
    """:func:`decimal_past_precision` below the walk of the type: each chunk, each decimal array, each nested array's
    children (a child holding no decimal returns at its first look)."""
    if isinstance(array, pa.ChunkedArray):
        for chunk in array.chunks:
            _floor_in(chunk)
        return
    width = DECIMAL_BYTES.get(array.type.id)
    if width is None:
        if array.type.id in NESTED:
            for child in _children(array):
                _floor_in(child)
        return
    if len(array) == 0:
        return
    word = np.dtype(np.int64)
    per_value = width // word.itemsize
    # only the words of its values (validated: the buffer holds them), whatever the buffer's length past them
    words = np.frombuffer(array.buffers()[1], dtype=word, count=(array.offset + len(array)) * per_value)
    words = words[array.offset * per_value:].reshape(-1, per_value)
    floor = (words[:, -1] == np.iinfo(word).min) & ~words[:, :-1].any(axis=1)
    if array.null_count:
        floor &= pc.is_valid(array).to_numpy(zero_copy_only=False)
    hits = np.flatnonzero(floor)
    if hits.size:
        raise pa.ArrowInvalid(f"the {array.type} value at index {int(hits[0])} is its width's most negative number, "
                              f"which fits no precision of {array.type}")


def holds_decimal(kind: pa.DataType) -> bool:
    """Whether ``kind`` is, or holds at any depth, a decimal whose width's floor Arrow misses (:data:`DECIMAL_BYTES`).
    A walk with a stack of its own (a type nested deeper than Python's recursion limit is still answered), by type
    ids: a read checks every nested column's type with it, so each step is kept to an attribute or two."""
    waiting = [kind]
    while waiting:
        kind = waiting.pop()
        kid = kind.id
        if kid in DECIMAL_BYTES:
            return True
        if kid not in NESTED:
            continue
        if kid in _ONE_CHILD:
            waiting.append(kind.value_type)
        elif kid == _EXTENSION:
            waiting.append(kind.storage_type)
        else:
            for k in range(kind.num_fields):
                waiting.append(kind.field(k).type)
    return False


def _children(array: pa.Array) -> list[pa.Array]:
    """The arrays a nested array's values live in (see :func:`decimal_past_precision` for which are whole)."""
    if isinstance(array, (pa.StructArray, pa.UnionArray)):
        return [array.field(k) for k in range(array.type.num_fields)]
    if isinstance(array, pa.ExtensionArray):
        return [array.storage]
    if isinstance(array, pa.DictionaryArray):
        return [array.dictionary]
    return [array.values]  # lists of every layout, maps (whose values are their entries) and run-end encoded arrays
