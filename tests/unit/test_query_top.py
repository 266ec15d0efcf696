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
    want = top.spec(25, keys, whole.column_names)
    parts = [whole.slice(start, 500) for start in range(0, 3_000, 500)]
    kept = pa.concat_tables([top.candidates(p, want) for p in parts])
    assert kept.num_rows <= 6 * 25 + pc_nan_rows(whole)
    ids = lambda t: t.column("k").to_pylist()  # noqa: E731  (k is unique: it names each row, NaN or not)
    assert ids(top.first(kept, want)) == ids(whole.sort_by(keys).slice(0, 25))
    order = ", ".join(f"{c} {'DESC' if o == 'descending' else 'ASC'} {'NULLS FIRST' if p == ['at_start'] else 'NULLS LAST'}"
                      for c, o, *p in keys)
    answers = []
    for table in (whole, kept):
        con = duckdb.connect()
        con.register("t", table)
        answers.append(con.sql(f"SELECT * FROM t ORDER BY {order} LIMIT 25").to_arrow_table())
    assert ids(answers[0]) == ids(answers[1])


def pc_nan_rows(table: pa.Table) -> int:
    return int(np.isnan(table.column("x").to_numpy(zero_copy_only=False)).sum())


def test_a_partition_smaller_than_the_limit_is_sent_whole_and_a_limit_of_zero_sends_nothing():
    t = messy(10, 2).drop_columns(["x"])
    assert top.candidates(t, top.spec(50, "k", t.column_names)).equals(t)
    assert top.candidates(t, top.spec(0, "k", t.column_names)).num_rows == 0


def test_bad_keys_are_clear_errors():
    names = ["x", "k"]
    for limit, by, word in ((-1, "k", "limit"), (3, [], "at least one"), (3, "nope", "unknown column"),
                            (3, ("k", "sideways"), "expected"), (3, ("k", "ascending", "middle"), "expected"),
                            (3, [1], "expected")):
        with pytest.raises(ValueError, match=word):
            top.spec(limit, by, names)
    with pytest.raises(RequestRejected) as info:
        top.candidates(pa.table({"a": [1, 2]}), TopRows((SortKey("b"),), 1))
    assert info.value.field == "ticket.top"


def test_a_ticket_refuses_first_rows_of_an_aggregate_without_keys_or_of_several_partitions():
    keys = TopRows((SortKey("k", True),), 5)
    assert Ticket.decode(Ticket("d", 1, (0, 0), top=keys).encode()).top == keys
    for bad in (Ticket("d", 1, (0, 0), top=keys, aggregate=Aggregate((("k", "sum"),))),
                Ticket("d", 1, (0, 0), top=TopRows((), 5)), Ticket("d", 1, (0, 0), top=keys, more=((1, 0),))):
        with pytest.raises(RequestRejected):
            Ticket.decode(bad.encode())
