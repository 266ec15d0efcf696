"""Appended rows meet the dataset's types as users see them: one logical type per kind, lossless widening, and
a mismatch that names the column, both types and the fix."""

from __future__ import annotations

import pyarrow as pa
import pytest

import flightpart as fp
from flightpart.client.reshape import conformed, conformed_stream
from flightpart.frames import widens_losslessly

DATASET = pa.schema([("s", pa.large_string()), ("n", pa.int64()), ("f", pa.float64()), ("b", pa.binary())])


@pytest.mark.parametrize("string_type", [pa.string(), pa.large_string(), pa.string_view()])
def test_every_string_encoding_appends_to_a_string_column(string_type):
    rows = pa.table({"s": pa.array(["x", None], string_type), "n": pa.array([1, 2], pa.int32()),
                     "f": pa.array([1, 2], pa.int16()), "b": pa.array([b"a", b"b"], pa.large_binary())})
    out = conformed(rows, DATASET)
    assert out.schema == DATASET and out.column("s").to_pylist() == ["x", None]


def test_a_float_column_of_whole_numbers_goes_into_an_int_column_and_a_fraction_is_refused():
    pandas_made = pa.table({"s": ["a", "b"], "n": [1.0, None], "f": [0.5, 1.5], "b": [b"", b""]})
    assert conformed(pandas_made, DATASET).column("n").to_pylist() == [1, None]
    with pytest.raises(fp.SchemaMismatch,
                       match=r"column 'n' .* holds values that are not int64 .*double.*cast it first"):
        conformed(pa.table({"s": ["a"], "n": [1.5], "f": [0.0], "b": [b""]}), DATASET)


def test_a_type_that_cannot_hold_the_values_names_column_types_and_fix():
    with pytest.raises(fp.SchemaMismatch) as caught:
        conformed(pa.table({"s": [1], "n": [1], "f": [0.0], "b": [b""]}), DATASET)
    assert "'s'" in str(caught.value) and "int64" in str(caught.value) and "large_string" in str(caught.value)
    assert "cast it first" in str(caught.value) and caught.value.field == "schema.s"


def test_columns_in_another_order_are_taken_and_missing_or_extra_ones_named():
    reordered = pa.table({"b": [b"x"], "f": [1.0], "n": [2], "s": ["y"]})
    assert conformed(reordered, DATASET).schema.names == DATASET.names
    with pytest.raises(fp.SchemaMismatch, match=r"missing \['b'\]; not in the dataset \['z'\]"):
        conformed(pa.table({"s": ["a"], "n": [1], "f": [0.0], "z": [1]}), DATASET)


def test_a_stream_is_conformed_batch_by_batch_and_a_bad_batch_is_named():
    batches = [pa.record_batch({"s": ["a"], "n": [1.0], "f": [1.0], "b": [b""]}),
               pa.record_batch({"s": ["b"], "n": [2.5], "f": [1.0], "b": [b""]})]
    reader = conformed_stream(pa.RecordBatchReader.from_batches(batches[0].schema, iter(batches)), DATASET)
    assert reader.read_next_batch().column("n").to_pylist() == [1]
    with pytest.raises(fp.SchemaMismatch, match="'n'"):
        reader.read_next_batch()


@pytest.mark.parametrize("source, target, expected", [
    (pa.int8(), pa.int64(), True), (pa.int64(), pa.int32(), False), (pa.uint8(), pa.int16(), True),
    (pa.uint64(), pa.int64(), False), (pa.int32(), pa.float64(), True), (pa.int64(), pa.float64(), False),
    (pa.float32(), pa.float64(), True), (pa.date32(), pa.timestamp("us"), True), (pa.string(), pa.binary(), False),
])
def test_lossless_widening(source, target, expected):
    assert widens_losslessly(source, target) is expected
