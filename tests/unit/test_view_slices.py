"""A batch with string or binary views is cut into pieces that carry only their own values.

A slice of a view array points into every data buffer of the whole array, and Arrow's IPC writer writes them all
with each batch: cut into 1 MiB slices, a 15 MB table of ``string_view`` was sent and stored as a 1.9 GB file.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightpart.frames import filter_rows, schema_without_views, take_rows, without_views
from flightpart.io.transfer import split_batch

ROWS = 120_000


def written_bytes(batches: list[pa.RecordBatch]) -> int:
    """What an IPC stream of ``batches`` takes: what a put sends and a node stores."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().size


def strings(n: int, kind: pa.DataType = pa.string_view()) -> pa.Array:
    values = [f"value-{i:08d}-" + "x" * 40 for i in range(n)]
    return pa.array(values if kind == pa.string_view() else [v.encode() for v in values], kind)


def viewed_batch() -> pa.RecordBatch:
    nested = pa.StructArray.from_arrays([strings(ROWS, pa.binary_view()), pa.array(range(ROWS))], ["blob", "k"])
    listed = pa.ListArray.from_arrays(pa.array(range(0, 2 * ROWS + 1, 2), pa.int32()), strings(2 * ROWS))
    mapped = pa.MapArray.from_arrays(pa.array(range(ROWS + 1), pa.int32()), strings(ROWS), pa.array(range(ROWS)))
    return pa.record_batch([strings(ROWS), nested, listed, mapped, pa.array(range(ROWS))],
                           names=["s", "nested", "listed", "mapped", "n"])


@pytest.mark.parametrize("column", ["s", "nested", "listed", "mapped"])
def test_the_pieces_of_a_view_column_hold_its_rows_and_type_and_no_more_bytes_than_the_whole(column):
    batch = viewed_batch().select([column])
    whole = written_bytes([batch])
    pieces = split_batch(batch, 1 << 20)
    assert len(pieces) > 4
    assert pa.Table.from_batches(pieces).equals(pa.Table.from_batches([batch]))  # same rows, same types
    assert all(p.schema == batch.schema for p in pieces)
    assert written_bytes(pieces) < 1.1 * whole, (written_bytes(pieces), whole)
    assert max(p.nbytes for p in pieces) < 3 << 20  # each piece about the target, as a plain column's


def test_a_thin_slice_of_a_large_view_array_is_cut_by_its_own_size_not_by_the_buffers_it_points_into():
    batch = viewed_batch().select(["s", "n"]).slice(50_000, 40_000)  # nbytes counts the whole array's buffers
    pieces = split_batch(batch, 1 << 20)
    assert pa.Table.from_batches(pieces).equals(pa.Table.from_batches([batch]))
    assert written_bytes(pieces) < 1.1 * written_bytes([batch.select(["s", "n"]).cast(
        schema_without_views(batch.schema)).cast(batch.schema)])
    assert len(pieces) <= 6  # some 3 MB of its own values: a few pieces, not one per megabyte of the whole array


def test_a_batch_without_views_is_cut_into_zero_copy_slices():
    batch = pa.record_batch([pa.array(range(1_000_000))], names=["n"])
    pieces = split_batch(batch, 1 << 20)
    assert len(pieces) > 4
    assert all(p.column(0).buffers()[1].address == batch.column(0).buffers()[1].address for p in pieces)


def test_a_view_inside_a_list_view_or_a_dictionary_is_left_as_it_is():
    assert without_views(pa.list_view(pa.string_view())) is None
    assert without_views(pa.dictionary(pa.int32(), pa.string_view())) is None
    assert without_views(pa.int64()) is None
    assert without_views(pa.struct([("a", pa.int64()), ("b", pa.list_(pa.binary_view()))])) == pa.struct(
        [("a", pa.int64()), ("b", pa.list_(pa.large_binary()))])
    assert schema_without_views(pa.schema([("n", pa.int64())])) is None


def test_rows_of_view_columns_are_filtered_and_taken_though_arrow_has_no_kernel_for_them():
    """Arrow's filter, take and sort take no string view: a node's filter or top over such a dataset had failed."""
    table = pa.Table.from_batches([viewed_batch().select(["s", "n"])]).combine_chunks()
    table = pa.Table.from_batches(table.to_batches(max_chunksize=ROWS // 3))
    assert table.column("s").num_chunks == 3
    mask = pa.array([None if k % 7 == 0 else k % 3 == 0 for k in range(ROWS)])
    kept = filter_rows(table, mask)
    plain = table.cast(schema_without_views(table.schema))
    assert kept.schema == table.schema and kept.to_pylist() == plain.filter(mask).to_pylist()
    picks = pa.array([5, ROWS - 1, 0, 5])
    assert take_rows(table, picks).to_pylist() == plain.take(picks).to_pylist()
    assert take_rows(table, picks).schema == table.schema


def test_a_category_filter_answers_over_chunks_with_different_dictionaries_and_nulls():
    """A node answers a filter on a category once per partition, after unifying the chunks' dictionaries: chunks
    with other categories, and null rows, keep exactly the rows pyarrow keeps over the decoded values."""
    from pyarrow import compute as pc

    from flightpart.query import filters

    chunks = [pa.DictionaryArray.from_arrays(pa.array([0, 1, None, 1]), pa.array(["red", "blue"])),
              pa.DictionaryArray.from_arrays(pa.array([1, 0, 2]), pa.array(["green", "red", None]))]
    table = pa.table({"colour": pa.chunked_array(chunks), "k": range(7)})
    decoded = table.set_column(0, "colour", table.column("colour").cast(pa.string()))
    for expression in (pc.field("colour") == "red", pc.field("colour").is_null(), ~(pc.field("colour") == "blue")):
        raw = filters.serialize(expression, table.schema)
        got = filters.apply(table, raw)
        assert got.column("k").to_pylist() == decoded.filter(expression).column("k").to_pylist(), expression
        assert got.schema == table.schema
