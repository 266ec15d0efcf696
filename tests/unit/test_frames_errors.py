"""Frames Arrow cannot type are refused in the user's terms: the column, the types it mixes, and the fix."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

import flightpart as fp
from flightpart.frames import check_columns, to_arrow


def test_a_mixed_type_object_column_names_the_column_its_types_and_the_fix():
    frame = pd.DataFrame({"ok": [1, 2, 3], "mixed": [1, "x", 2.5]})
    with pytest.raises(fp.SchemaMismatch) as caught:
        to_arrow(frame)
    message = str(caught.value)
    assert "'mixed'" in message and "float, int, str" in message and "astype(str)" in message
    assert caught.value.code == "SCHEMA_MISMATCH" and caught.value.field == "columns.mixed"
    assert "'ok'" not in message


def test_a_pandas_frame_naming_a_column_twice_is_refused_with_a_code():
    """pyarrow's own ``ValueError: Duplicate column names found`` had reached the user, with no code."""
    with pytest.raises(fp.SchemaMismatch, match=r"\['a'\] more than once") as caught:
        to_arrow(pd.DataFrame([[1, 2, 3]], columns=["a", "a", "b"]))
    assert caught.value.code == "SCHEMA_MISMATCH" and caught.value.field == "columns"


def test_a_column_with_nulls_and_one_type_is_not_refused():
    table = to_arrow(pd.DataFrame({"s": ["a", None, "b"], "f": [1.0, None, float("nan")]}))
    assert table.column("s").null_count == 1 and table.num_rows == 3


def test_polars_columns_arrow_cannot_hold_are_named_with_the_fix():
    """A Polars Object column had been stored as its objects' addresses; Int128 failed with "unsupported format
    string '_pli128'", naming no column."""
    pl = pytest.importorskip("polars")
    with pytest.raises(fp.SchemaMismatch, match=r"column 'obj' holds Python objects .*map_elements") as caught:
        to_arrow(pl.DataFrame({"id": [1, 2], "obj": pl.Series([object(), object()], dtype=pl.Object)}))
    assert caught.value.field == "columns.obj"
    for kind in (pl.Int128, pl.UInt128):
        with pytest.raises(fp.SchemaMismatch, match=rf"column 'x' is Polars {kind.__name__}.*cast it first"):
            to_arrow(pl.DataFrame({"x": pl.Series([1, 2], dtype=kind)}))


def test_a_frame_of_no_column_or_a_column_named_twice_is_refused_before_anything_is_stored():
    """Stored, a frame of 3 rows and no column read back as 0 rows; one with a column named twice could never be read
    (every read selects by name)."""
    with pytest.raises(fp.SchemaMismatch, match="has no column"):
        check_columns(pa.table({"a": [1, 2, 3]}).select([]).schema)
    with pytest.raises(fp.SchemaMismatch, match="'d' is named twice") as caught:
        check_columns(pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["d", "d"]).schema)
    assert caught.value.field == "columns.d"
    check_columns(pa.table({"a": [1], "b": [2]}).schema)
