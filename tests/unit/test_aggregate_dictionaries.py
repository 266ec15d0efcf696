"""Aggregates over dictionary-encoded columns count and group by values, as DuckDB and Polars do, and never hand
Arrow a dictionary it crashes on (``count`` over a dictionary of the null type, ``unify_dictionaries`` over
grouped keys with a null): each check runs in a subprocess, so a crash is seen as a signal, not the end of the run."""

from __future__ import annotations

import subprocess
import sys

import pytest

PRELUDE = """
import pyarrow as pa, pyarrow.compute as pc
from flightpart.query import aggregates as ag

def both_ways(parts, pairs, by):
    '''flightpart's partials and combine against pyarrow's group_by over the rows with every dictionary decoded.'''
    schema = parts[0].schema
    agg = ag.spec(pairs, by, schema)
    expected = ag.partial_schema(agg, schema)
    got = ag.combine(ag.checked_partials([ag.partial(p, agg) for p in parts], agg, expected, 10**6), agg, schema)
    whole = pa.concat_tables(parts)
    plain = whole.cast(pa.schema([pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type)
                                  for f in whole.schema]))
    want = plain.group_by(by, use_threads=False).aggregate(pairs)
    order = [(k, "ascending") for k in by]
    decoded = got.cast(want.schema) if by else got
    assert decoded.sort_by(order).equals(want.sort_by(order)) if by else decoded.equals(want), (got, want)
    return got
"""

CASES = {
    "a dictionary of the null type": """
col = pa.DictionaryArray.from_arrays(pa.array([0, 1, None, 0], pa.int32()), pa.nulls(2))
t = pa.table({"c": col, "g": pa.array([1, 1, 2, 2])})
got = both_ways([t], [("c", "count")], [])
assert got.column("c_count").to_pylist() == [0]
got = both_ways([t], [("c", "count")], ["g"])
assert sorted(got.column("c_count").to_pylist()) == [0, 0]
""",
    "null values in a dictionary": """
col = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0, None, 1], pa.int32()), pa.array(["a", None]))
t = pa.table({"c": col, "g": pa.array([1, 1, 2, 2, 2])})
got = both_ways([t], [("c", "count"), ("c", "min"), ("c", "max")], ["g"])
assert dict(zip(got.column("g").to_pylist(), got.column("c_count").to_pylist())) == {1: 1, 2: 1}
""",
    "keys with other dictionaries per partition and a null key": """
def part(indices, words, values):
    return pa.table({"c": pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(words)),
                     "v": pa.array(values)})
parts = [part([0, 1, 1], ["x", "a"], [1, 2, 3]), part([1, 0, None], ["a", "x"], [10, 20, 30]),
         part([None, 0], ["q"], [5, 6])]
got = both_ways(parts, [("v", "sum"), ("v", "count")], ["c"])
assert got.schema.field("c").type == parts[0].group_by(["c"]).aggregate([("v", "sum")]).schema.field("c").type
""",
    "int8 indices, as a small dictionary is often stored": """
def part(indices, words):
    return pa.table({"c": pa.DictionaryArray.from_arrays(pa.array(indices, pa.int8()), pa.array(words)),
                     "v": pa.array(range(len(indices)))})
both_ways([part([0, 1, None], ["x", "a"]), part([0, 0, 1], ["a", "z"])], [("v", "sum"), ("c", "count")], ["c"])
""",
}


@pytest.mark.parametrize("case", list(CASES))
def test_dictionary_columns_aggregate_by_their_values_without_a_crash(case):
    done = subprocess.run([sys.executable, "-c", PRELUDE + CASES[case]], capture_output=True, text=True, timeout=120)
    assert done.returncode >= 0, f"killed by signal {-done.returncode}"
    assert done.returncode == 0, done.stderr[-2000:]


def test_an_aggregate_arrow_cannot_compute_over_no_rows_is_refused_with_a_code():
    import pyarrow as pa

    from flightpart.errors import RequestRejected
    from flightpart.query import aggregates as ag

    schema = pa.schema([("when", pa.date32()), ("k", pa.int64())])
    agg = ag.spec([("when", "sum")], ["k"], schema)
    with pytest.raises(RequestRejected, match="aggregate"):
        ag.combine([], agg, schema)
