"""Whether a table another process streamed is safe to compute on.

pyarrow's stream reader does not check buffers against the rows a batch claims, so a faulty node's offsets,
dictionary indices or views past their buffers make any kernel, DuckDB scan or Polars conversion read out of
bounds. :func:`unsound` is the check every receiver makes before anything reads the table (decision 0011).

Text columns are checked as bytes (offsets in bounds and in order), not as UTF-8: memory safety is the goal.
Every other column gets Arrow's full validation, which alone compares a validity bitmap with the declared null
count that several kernels size buffers from.
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
"""Types (by type id) that hold values of other types (an extension type its storage), where a decimal at its width's
floor can hide as deep as it likes: DuckDB, asked to cast a list or a struct of one to text, failed inside itself and
invalidated the caller's database as it did for a plain column. Each read walks its nested columns' types
(:func:`holds_decimal`, some 2 µs a column); flat columns pay one set lookup."""


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
    """Raise ArrowInvalid when a decimal array, at any depth of nesting, holds its width's most negative number
    (:data:`DECIMAL_BYTES`), the one value past the precision that Arrow's full validation misses; so the two
    together check a decimal whole. Null slots are skipped; arrays holding no decimal return at once. Values a
    parent does not reach (a list's, a dictionary's, a run-end array's, a dense union's) are checked whole."""
    if holds_decimal(array.type):  # the type walked once, not again at each level or chunk below
        _floor_in(array)


def _floor_in(array: pa.Array | pa.ChunkedArray) -> None:
    """:func:`decimal_past_precision` for one array, walking its chunks and children."""
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
    """Whether ``kind`` is, or holds at any depth, a decimal whose width's floor Arrow misses (:data:`DECIMAL_BYTES`);
    iterative, so types nested past Python's recursion limit are answered."""
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
    """The arrays a nested array's values live in."""
    if isinstance(array, (pa.StructArray, pa.UnionArray)):
        return [array.field(k) for k in range(array.type.num_fields)]
    if isinstance(array, pa.ExtensionArray):
        return [array.storage]
    if isinstance(array, pa.DictionaryArray):
        return [array.dictionary]
    return [array.values]  # lists of every layout, maps (whose values are their entries) and run-end encoded arrays
