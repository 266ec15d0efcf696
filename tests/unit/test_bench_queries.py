"""The analytical-queries bench compares answers across engines: equal answers match whatever their shape, wrong ones do
not."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

from flightpart.bench.queries import QUESTIONS, canonical, same_answer, taxi_table


def test_one_answer_in_every_engines_shape_is_one_canonical_answer():
    duck = [("card", 7, 12.5), ("cash", 3, 9.25)]
    arrow = pa.table({"fare_count": [3, 7], "fare_mean": [9.25, 12.5], "payment": ["cash", "card"]})
    pandas_rows = [("card", np.int64(7), np.float64(12.5)), ("cash", np.int64(3), np.float64(9.25))]
    assert canonical(duck) == canonical(arrow) == canonical(pandas_rows)
    assert canonical(duck) != canonical([("card", 7, 12.5), ("cash", 3, 9.5)])
    assert canonical(np.float64(3.0)) == canonical([(3,)])


def test_the_taxi_table_has_what_real_trips_have_and_every_question_runs_on_it():
    trips = taxi_table(5_000)
    assert trips.column("passengers").null_count > 0 and pa.types.is_timestamp(trips.schema.field("pickup_at").type)
    assert any("'" in z for z in trips.column("pickup_zone").unique().to_pylist())
    con = duckdb.connect()
    con.register("t", trips)
    for question, sql in QUESTIONS.items():
        assert con.sql(sql.format(t="t")).fetchall(), question


def test_sums_that_differ_only_in_summation_order_are_the_same_answer_and_others_are_not():
    exact = canonical([("card", 7, 153_489_012.123456789)])
    reordered = canonical([("card", 7, 153_489_012.123457301)])  # ten million floats added in another order
    assert same_answer(reordered, exact)
    assert not same_answer(canonical([("card", 7, 153_489_012.123456789 * 1.001)]), exact)
    assert not same_answer(canonical([("cash", 7, 153_489_012.123456789)]), exact)
    assert not same_answer(canonical([("card", 8, 153_489_012.123456789)]), exact)
    assert not same_answer(exact + exact, exact)

