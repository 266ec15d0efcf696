"""The check every table read from another process passes before anything reads it
(flightpart.query.soundness): lying offsets and indices are found in every text layout and however many chunks a
column has; text that is not UTF-8 is bytes, safe to hold, and passes."""

import numpy as np
import pyarrow as pa
import pytest

from flightpart.query.soundness import VIEWED_CHUNKS, unsound


def lying_text(kind: pa.DataType) -> pa.Array:
    """Two values, the first running 1,000 bytes past the data (offsets out of order: the last one, all a stream
    reader checks, is in bounds)."""
    width = np.int64 if kind == pa.large_string() else np.int32
    offsets = pa.py_buffer(np.array([0, 1002, 4], dtype=width).tobytes())
    return pa.Array.from_buffers(kind, 2, [None, offsets, pa.py_buffer(b"abcd")])


def lying_view() -> pa.Array:
    """One string view of 40 bytes in a data buffer of 4 (a view's 16 bytes: length, prefix, buffer, offset)."""
    view = np.array([40], dtype=np.int32).tobytes() + b"abcd" + np.array([0, 0], dtype=np.int32).tobytes()
    return pa.Array.from_buffers(pa.string_view(), 1, [None, pa.py_buffer(view), pa.py_buffer(b"abcd")])


def chunked(bad: pa.Array, chunks: int) -> pa.ChunkedArray:
    good = pa.array(["x", "y"], bad.type)
    return pa.chunked_array([good] * (chunks - 1) + [bad], bad.type)


@pytest.mark.parametrize("chunks", [1, VIEWED_CHUNKS + 5])
@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_text_offsets_past_the_data_are_found(kind, chunks):
    bad = lying_text(kind)
    bad.validate()  # what a stream reader checks passes
    table = pa.table({"n": pa.array(range(2 * chunks)).cast(pa.int64()), "s": chunked(bad, chunks)})
    why = unsound(table)
    assert why is not None and why.startswith("column 's'")


@pytest.mark.parametrize("chunks", [1, VIEWED_CHUNKS + 5])
def test_a_view_past_its_buffer_is_found(chunks):
    table = pa.table({"s": chunked(lying_view(), chunks)})
    assert unsound(table) is not None


def test_dictionary_indices_past_the_dictionary_are_found():
    column = pa.DictionaryArray.from_arrays(pa.array([0, 7], pa.int32()), pa.array(["a", "b"]), safe=False)
    assert "column 'd'" in unsound(pa.table({"d": column}))


def test_list_offsets_past_the_values_are_found():
    offsets = pa.py_buffer(np.array([0, 50, 2], dtype=np.int32).tobytes())
    column = pa.Array.from_buffers(pa.list_(pa.int64()), 2, [None, offsets], children=[pa.array([1, 2])])
    assert "column 'l'" in unsound(pa.table({"l": column}))


@pytest.mark.parametrize("chunks", [1, VIEWED_CHUNKS + 5])
def test_text_that_is_not_utf8_is_sound(chunks):
    offsets = pa.py_buffer(np.array([0, 2, 4], dtype=np.int32).tobytes())
    odd = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"\xff\xfeab")])
    table = pa.table({"s": chunked(odd, chunks), "f": pa.array(np.arange(2.0 * chunks))})
    assert unsound(table) is None


def test_honest_tables_are_sound():
    table = pa.table({
        "s": pa.chunked_array([pa.array(["a", None, "ccc"])] * (VIEWED_CHUNKS + 1)),
        "v": pa.array(["x", "y", "z"] * (VIEWED_CHUNKS + 1), pa.string_view()),
        "l": pa.array([[1], [], None] * (VIEWED_CHUNKS + 1)),
        "d": pa.array(["p", "q", "p"] * (VIEWED_CHUNKS + 1)).dictionary_encode(),
    })
    assert unsound(table) is None
    assert unsound(table.slice(1, 7)) is None


@pytest.mark.parametrize("kind", [pa.int64(), pa.float64(), pa.bool_(), pa.decimal128(9, 2), pa.binary(4)])
def test_fixed_width_columns_shorter_than_their_rows_are_found(kind):
    """pyarrow's stream reader does not even check buffer sizes against the rows a batch claims: a batch of 10
    values that says it has 4,096 rows reads as 4,096 rows over 10 values' memory."""
    import struct

    values = {pa.bool_(): True, pa.binary(4): b"abcd"}.get(kind, 7)
    honest = pa.record_batch({"x": pa.array([values] * 10, kind)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, honest.schema) as writer:
        writer.write_batch(honest)
    stream = sink.getvalue().to_pybytes()
    lying = stream.replace(struct.pack("<q", 10), struct.pack("<q", 4096))  # the batch's and the column's lengths
    table = pa.ipc.open_stream(lying).read_all()
    assert table.num_rows == 4096  # read without complaint
    why = unsound(table)
    assert why.startswith("column 'x'") and "too small" in why


def test_a_short_column_among_many_is_named():
    """Layouts are checked for the whole table in one call; the column at fault is still the one named (columns of
    nulls, which hold no buffers, are sound at any length)."""
    import struct

    honest = pa.record_batch({"a": pa.nulls(10), "b": pa.nulls(10), "x": pa.array(np.arange(10.0))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, honest.schema) as writer:
        writer.write_batch(honest)
    lying = sink.getvalue().to_pybytes().replace(struct.pack("<q", 10), struct.pack("<q", 4096))
    table = pa.ipc.open_stream(lying).read_all()
    assert table.num_rows == 4096
    why = unsound(table)
    assert why is not None and why.startswith("column 'x'") and "too small" in why


@pytest.mark.parametrize("kind", ["time of day", "decimal"])
def test_fixed_width_values_arrow_checks_are_still_checked(kind):
    """Most fixed-width columns are checked by their layout alone; a time of day past midnight and a decimal past
    its precision (a sum that wrapped) are values Arrow's full validation refuses, and so does the check."""
    if kind == "time of day":
        bad = pa.Array.from_buffers(pa.time32("s"), 2, [None, pa.py_buffer(np.array([5, 100_000], np.int32).tobytes())])
    else:
        from decimal import Decimal

        big = pa.table({"k": [1, 1], "v": pa.array([Decimal("9" * 38)] * 2, pa.decimal128(38, 0))})
        bad = big.group_by("k").aggregate([("v", "sum")]).column("v_sum").chunk(0)
    bad.validate()
    why = unsound(pa.table({"n": pa.array(np.arange(float(len(bad)))), "t": bad}))
    assert why is not None and why.startswith("column 't'")


@pytest.mark.parametrize("kind", [pa.int64(), pa.bool_(), pa.binary(4)])
def test_a_null_count_that_lies_is_found(kind):
    """A fixed-width column's layout can be right while its declared null count is not: pyarrow's quantile and
    sort, its Parquet writer and Polars' sort and rank size buffers from that count and were killed by such a
    column. Only Arrow's full validation compares it with the validity bitmap, so fixed-width columns get it too."""
    import struct

    value = {pa.bool_(): True, pa.binary(4): b"abcd"}.get(kind, 7)
    honest = pa.record_batch({"x": pa.array([None if k in (3, 9) else value for k in range(20)], kind)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, honest.schema) as writer:
        writer.write_batch(honest)
    stream = sink.getvalue().to_pybytes()
    assert stream.count(struct.pack("<qq", 20, 2)) == 1  # the column's node: 20 rows, 2 nulls
    lying = pa.ipc.open_stream(stream.replace(struct.pack("<qq", 20, 2), struct.pack("<qq", 20, 1))).read_all()
    lying.validate()  # what a stream reader checks passes
    assert lying.column("x").null_count == 1
    why = unsound(lying)
    assert why is not None and why.startswith("column 'x'") and "null_count" in why


def floor_decimals(kind: pa.DataType, null_at_floor: bool = False) -> pa.Array:
    """Three values of ``kind``: 1, its width's most negative number (a null slot holding it, when asked), 2."""
    width = kind.byte_width
    floor = (-(1 << (8 * width - 1))).to_bytes(width, "little", signed=True)
    values = (1).to_bytes(width, "little", signed=True) + floor + (2).to_bytes(width, "little", signed=True)
    validity = pa.py_buffer(bytes([0b101])) if null_at_floor else None
    return pa.Array.from_buffers(kind, 3, [validity, pa.py_buffer(values)], null_count=1 if null_at_floor else 0)


DECIMALS = [pa.decimal32(9, 0), pa.decimal64(18, 2), pa.decimal128(38, 0), pa.decimal256(76, 0)]


@pytest.mark.parametrize("kind", DECIMALS, ids=str)
def test_a_decimal_at_its_widths_floor_is_found(kind):
    """The most negative number of a decimal's width fits none of its precisions, yet Arrow's full validation lets
    it through; DuckDB, asked to cast it to text, failed inside itself and invalidated its database."""
    bad = floor_decimals(kind)
    if kind.byte_width >= 16:
        bad.validate(full=True)  # what Arrow alone says of 128- and 256-bit decimals
    why = unsound(pa.table({"n": pa.array([1.0, 2.0, 3.0]), "v": pa.chunked_array([bad[:1], bad[1:]])}))
    assert why is not None and why.startswith("column 'v'") and "precision" in why


@pytest.mark.parametrize("kind", DECIMALS, ids=str)
def test_a_null_slot_holding_the_floor_is_not_a_value(kind):
    assert unsound(pa.table({"v": floor_decimals(kind, null_at_floor=True)})) is None


def _offsets(n: int) -> pa.Array:
    return pa.array(range(n + 1), pa.int32())


NESTINGS = {
    "list": lambda v: pa.ListArray.from_arrays(_offsets(len(v)), v),
    "large_list": lambda v: pa.LargeListArray.from_arrays(pa.array(range(len(v) + 1), pa.int64()), v),
    "fixed_size_list": lambda v: pa.FixedSizeListArray.from_arrays(v, 1),
    "list_view": lambda v: pa.ListViewArray.from_arrays(pa.array(range(len(v)), pa.int32()),
                                                        pa.array([1] * len(v), pa.int32()), v),
    "struct": lambda v: pa.StructArray.from_arrays([pa.array(range(len(v))), v], ["k", "d"]),
    "map": lambda v: pa.MapArray.from_arrays(_offsets(len(v)), pa.array(range(len(v)), pa.int8()), v),
    "dictionary": lambda v: pa.DictionaryArray.from_arrays(pa.array(range(len(v)), pa.int8()), v),
    "run_end_encoded": lambda v: pa.RunEndEncodedArray.from_arrays(pa.array(range(1, len(v) + 1), pa.int32()), v),
    "sparse_union": lambda v: pa.UnionArray.from_sparse(pa.array([0] * len(v), pa.int8()), [v]),
    "dense_union": lambda v: pa.UnionArray.from_dense(pa.array([0] * len(v), pa.int8()),
                                                      pa.array(range(len(v)), pa.int32()), [v]),
    "list of structs of lists": lambda v: NESTINGS["list"](NESTINGS["struct"](NESTINGS["list"](v))),
}


@pytest.mark.parametrize("nesting", NESTINGS)
@pytest.mark.parametrize("kind", DECIMALS[2:], ids=str)
def test_a_decimal_at_its_floor_inside_a_nested_column_is_found(kind, nesting):
    """Arrow's validation misses the floor at any depth, and DuckDB, asked to cast a list or struct holding one to
    text, failed inside itself and invalidated the caller's database as for a plain column."""
    bad = NESTINGS[nesting](floor_decimals(kind))
    bad.validate(full=True)  # what Arrow alone says
    why = unsound(pa.table({"n": pa.array([1.0, 2.0, 3.0]), "v": bad}))
    assert why is not None and why.startswith("column 'v'") and "most negative" in why
    honest = NESTINGS[nesting](pa.array([1, -2, 3], kind))
    assert unsound(pa.table({"v": honest})) is None
    assert unsound(pa.table({"v": NESTINGS[nesting](floor_decimals(kind, null_at_floor=True))})) is None
