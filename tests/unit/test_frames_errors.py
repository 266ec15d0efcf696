"""Frames Arrow cannot type are refused in the user's terms: the column, the types it mixes, and the fix."""

from __future__ import annotations

import pandas as pd
import pytest

import flightpart as fp
from flightpart.frames import to_arrow


def test_a_mixed_type_object_column_names_the_column_its_types_and_the_fix():
    frame = pd.DataFrame({"ok": [1, 2, 3], "mixed": [1, "x", 2.5]})
    with pytest.raises(fp.SchemaMismatch) as caught:
        to_arrow(frame)
    message = str(caught.value)
    assert "'mixed'" in message and "float, int, str" in message and "astype(str)" in message
    assert caught.value.code == "SCHEMA_MISMATCH" and caught.value.field == "columns.mixed"
    assert "'ok'" not in message


def test_a_column_with_nulls_and_one_type_is_not_refused():
    table = to_arrow(pd.DataFrame({"s": ["a", None, "b"], "f": [1.0, None, float("nan")]}))
    assert table.column("s").null_count == 1 and table.num_rows == 3
