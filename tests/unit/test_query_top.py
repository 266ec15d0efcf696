"""First rows by sort keys (``ORDER BY ... LIMIT``): what each partition keeps holds the answer under pyarrow's
ordering and DuckDB's, nulls and NaN included; bad keys are clear errors. No cluster needed."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from flightpart.errors import RequestRejected
from flightpart.query import top
from flightpart.wire import Aggregate, SortKey, Ticket, TopRows


def messy(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 50, rows).astype(float)
    x[rng.random(rows) < 0.1] = np.nan
    return pa.table({"x": pa.array(x, mask=rng.random(rows) < 0.1), "k": rng.permutation(rows),
                     "s": pa.array([f"s{v}" for v in rng.integers(0, 9, rows)], mask=rng.random(rows) < 0.1)})


@pytest.mark.parametrize("keys", [
    [("x", "descending"), ("k", "ascending")],
    [("x", "ascending", "at_start"), ("k", "descending")],
    [("s", "descending", "at_start"), ("x", "descending", "at_end"), ("k", "ascending")],
])
def test_each_partitions_first_rows_hold_the_answer_of_pyarrow_and_of_duckdb(keys):
    whole = messy(3_000, 1)
    want = top.spec(25, keys, whole.schema)
    parts = [whole.slice(start, 500) for start in range(0, 3_000, 500)]
    kept = pa.concat_tables([top.candidates(p, want) for p in parts])
    assert kept.num_rows <= 6 * 25 + pc_nan_rows(whole)
    ids = lambda t: t.column("k").to_pylist()  # noqa: E731  (k is unique: it names each row, NaN or not)
    assert ids(top.first(kept, want)) == ids(whole.sort_by(keys).slice(0, 25))
    order = ", ".join(f"{c} {'DESC' if o == 'descending' else 'ASC'} "
                      f"{'NULLS FIRST' if p == ['at_start'] else 'NULLS LAST'}"
                      for c, o, *p in keys)
    answers = []
    for table in (whole, kept):
        con = duckdb.connect()
        con.register("t", table)
        answers.append(con.sql(f"SELECT * FROM t ORDER BY {order} LIMIT 25").to_arrow_table())
    assert ids(answers[0]) == ids(answers[1])


@pytest.mark.parametrize("first", ["i", "f", "t"])
@pytest.mark.parametrize("order", ["descending", "ascending"])
def test_a_large_partition_cut_by_its_first_key_keeps_the_answer_ties_included(first, order):
    """Partitions past PREFILTER_ROWS are first cut by their first key (many ties on it: the second key decides)."""
    rng = np.random.default_rng(7)
    rows = 40_000
    ints = rng.integers(0, 30, rows)  # about 1,300 rows a value: the limit falls inside a tie
    whole = pa.table({"i": ints, "f": ints / 4 - 3.0,
                      "t": pa.array(ints * 1_000_000, pa.timestamp("us")), "k": rng.permutation(rows)})
    keys = [(first, order), ("k", "descending")]
    want = top.spec(10, keys, whole.schema)
    parts = [whole.slice(start, 10_000) for start in range(0, rows, 10_000)]
    kept = pa.concat_tables([top.candidates(p, want) for p in parts])
    assert top.first(kept, want).column("k").to_pylist() == whole.sort_by(keys).slice(0, 10).column("k").to_pylist()
    con = duckdb.connect()
    con.register("t", whole)
    sql = f"SELECT k FROM t ORDER BY {first} {'DESC' if order == 'descending' else 'ASC'}, k DESC LIMIT 10"
    assert con.sql(sql).fetchall() == [(k,) for k in top.first(kept, want).column("k").to_pylist()]


def pc_nan_rows(table: pa.Table) -> int:
    return int(np.isnan(table.column("x").to_numpy(zero_copy_only=False)).sum())


def test_a_partition_smaller_than_the_limit_is_sent_whole_and_a_limit_of_zero_sends_nothing():
    t = messy(10, 2).drop_columns(["x"])
    assert top.candidates(t, top.spec(50, "k", t.schema)).equals(t)
    assert top.candidates(t, top.spec(0, "k", t.schema)).num_rows == 0


def test_bad_keys_are_clear_errors():
    schema = pa.schema([("x", pa.float64()), ("k", pa.int64()), ("l", pa.list_(pa.int64()))])
    for limit, by, word in ((-1, "k", "limit"), (3, [], "at least one"), (3, "nope", "unknown column"),
                            (3, ("k", "sideways"), "expected"), (3, ("k", "ascending", "middle"), "expected"),
                            (3, [1], "expected"), (3, "l", "cannot be ordered by 'l'")):
        with pytest.raises(ValueError, match=word):
            top.spec(limit, by, schema)
    with pytest.raises(RequestRejected) as info:
        top.candidates(pa.table({"a": [1, 2]}), TopRows((SortKey("b"),), 1))
    assert info.value.field == "ticket.top"


@pytest.mark.parametrize("values", [
    pa.array([[2], [1], [3]] * 4), pa.array([{"a": 2}, {"a": 1}, {"a": 3}] * 4),
    pa.array([[("a", 2)], [("b", 1)], [("c", 3)]] * 4, pa.map_(pa.string(), pa.int64())),
    pa.array([2, 1, 3] * 4, pa.float16()),
    pa.array([pa.MonthDayNano([2, 0, 0]), pa.MonthDayNano([1, 0, 0]), pa.MonthDayNano([3, 0, 0])] * 4),
    pa.array([b"b" * 16, b"a" * 16, b"c" * 16] * 4, pa.uuid()),
], ids=lambda v: str(v.type))
def test_a_key_arrow_cannot_order_is_refused_before_arrow_sees_it(values):
    """Arrow's select_k kills the process on such a key: the check runs first (a crash would end this test run)."""
    t = pa.table({"key": values, "k": range(len(values))})
    with pytest.raises(RequestRejected, match="cannot be ordered by 'key'") as info:
        top.candidates(t, TopRows((SortKey("key"),), 2))
    assert info.value.field == "ticket.top"
    with pytest.raises(RequestRejected, match="cannot be ordered"):
        top.first(t, TopRows((SortKey("key"),), 2))


def test_a_dictionary_key_orders_by_its_values_whatever_its_dictionary():
    words = ["pear", "apple", None, "fig", "apple", "kiwi"] * 5
    chunks = [pa.array(words[:12]).dictionary_encode(), pa.DictionaryArray.from_arrays(
        pa.array([1, 0, 1, None, 0, 1] * 3, pa.int32()), pa.array(["zebra", "ant"]))]
    t = pa.table({"w": pa.chunked_array(chunks), "k": range(30)})
    decoded = t.set_column(0, "w", t.column("w").cast(pa.string()))
    for keys in ([("w", "ascending"), ("k", "ascending")], [("w", "descending", "at_start"), ("k", "descending")]):
        want = top.spec(7, keys, t.schema)
        assert top.first(top.candidates(t, want), want).column("k").equals(
            decoded.sort_by(keys).slice(0, 7).column("k"))


def test_a_ticket_refuses_first_rows_of_an_aggregate_or_without_keys():
    keys = TopRows((SortKey("k", True),), 5)
    assert Ticket.decode(Ticket("d", 1, (0, 0), top=keys).encode()).top == keys
    for bad in (Ticket("d", 1, (0, 0), top=keys, aggregate=Aggregate((("k", "sum"),))),
                Ticket("d", 1, (0, 0), top=TopRows((), 5))):
        with pytest.raises(RequestRejected):
            Ticket.decode(bad.encode())


def test_a_dictionary_key_whose_chunks_hold_nulls_in_their_dictionaries_is_taken_as_it_was_typed():
    """Arrow cannot unify such dictionaries to take rows across chunks: the rows are taken from the values and
    encoded again, so a node's answer keeps the partition's type."""
    d = pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, 3, 0, 1], pa.int8()),
                                       pa.array([1.5, float("nan"), -0.0, None]))
    t = pa.table({"c": pa.chunked_array([d.slice(0, 2), d.slice(2)]), "k": range(6)})
    want = TopRows((SortKey("c"),), 1)
    kept = top.candidates(t, want)
    assert kept.schema.equals(t.schema)
    assert sorted(kept.column("k").to_pylist()) == [1, 2, 5]  # the first by value (-0.0), and each NaN
    assert top.first(kept, want).column("k").to_pylist() == [2]


def test_a_string_view_key_is_ordered_as_its_strings_and_its_rows_keep_their_views():
    t = pa.table({"key": pa.array(["b", "a", None, "c"] * 3, pa.string_view()), "k": range(12)})
    got = top.candidates(t, TopRows((SortKey("key", descending=True),), 2))
    assert got.schema == t.schema and sorted(got.column("key").to_pylist()) == ["c", "c"]
