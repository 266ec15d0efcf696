"""``?`` parameters keep the pushdown: a parameterized query moves what its literal twin moves, answers as it does,
and EXPLAIN takes bound parameters."""

from __future__ import annotations

import datetime

import adbc_driver_flightsql.dbapi as flight_sql
import numpy as np
import pyarrow as pa
import pytest

import flightpart as fp

ROWS = 200_000
START = datetime.datetime(2024, 1, 1)


@pytest.fixture(scope="module")
def sql(make_cluster):
    cluster = make_cluster(2)
    table = pa.table({
        "a": np.arange(ROWS, dtype=np.int64),
        "s": pa.array([f"it's {k % 7}" for k in range(ROWS)]),
        "t": pa.array([START + datetime.timedelta(minutes=k) for k in range(ROWS)], pa.timestamp("us")),
        "v": np.arange(ROWS, dtype=np.float64) / 3,
    })
    with fp.connect(cluster.uri) as client:
        client.put("trips", table, tiling=(8, 1))
        with flight_sql.connect(cluster.uri) as conn:
            yield client, conn, table


def run(conn, query: str, parameters=None) -> pa.Table:
    with conn.cursor() as cur:
        cur.execute(query, parameters=parameters)
        return cur.fetch_arrow_table()


def moved(client, query: str) -> int:
    """The bytes the nodes sent for the last run of ``query`` (the catalog's query history)."""
    return next(q["bytes_from_nodes"] for q in client.queries().recent if q["text"] == query)


TWINS = [
    ("SELECT count(*) AS n FROM trips WHERE a >= ? AND a < ?", "SELECT count(*) AS n FROM trips WHERE a >= 1000 AND "
     "a < 5000", (1000, 5000)),
    ("SELECT s, count(*) AS n, sum(v) AS total FROM trips WHERE t >= ? GROUP BY s ORDER BY s",
     "SELECT s, count(*) AS n, sum(v) AS total FROM trips WHERE t >= TIMESTAMP '2024-03-01 00:00:00' GROUP BY s "
     "ORDER BY s", (datetime.datetime(2024, 3, 1),)),
    ("SELECT count(*) AS n FROM trips WHERE s = ?", "SELECT count(*) AS n FROM trips WHERE s = 'it''s 3'",
     ("it's 3",)),
]


@pytest.mark.parametrize("parameterized, literal, values", TWINS)
def test_a_parameterized_query_moves_what_its_literal_twin_moves(sql, parameterized, literal, values):
    client, conn, table = sql
    expected = run(conn, literal)
    answer = run(conn, parameterized, values)
    assert answer.to_pylist() == expected.to_pylist()
    assert moved(client, parameterized) == moved(client, literal)
    assert moved(client, parameterized) < table.nbytes // 100  # partials, not the rows


def test_explain_takes_bound_parameters_and_shows_the_work_on_the_nodes(sql):
    _client, conn, _table = sql
    parameterized, literal, values = TWINS[0]
    explained = run(conn, "EXPLAIN " + parameterized, values)
    twin = run(conn, "EXPLAIN " + literal)
    assert explained.column("where").to_pylist() == twin.column("where").to_pylist()
    assert explained.column("rows").to_pylist() == twin.column("rows").to_pylist()
    assert any("node" in where for where in explained.column("where").to_pylist())


def test_values_a_literal_cannot_carry_are_bound_by_duckdb_and_answer_the_same(sql):
    _client, conn, table = sql
    answer = run(conn, "SELECT count(*) AS n FROM trips WHERE list_contains(?, a)", ([3, 5, 7],))
    assert answer.to_pylist() == [{"n": 3}]


def test_a_wrong_number_of_values_is_refused_with_its_code(sql):
    _client, conn, _table = sql
    with pytest.raises(flight_sql.Error, match="parameter"):
        run(conn, "SELECT count(*) AS n FROM trips WHERE a > ? AND a < ?", (5,))
    with pytest.raises(flight_sql.Error, match="EXPLAIN with parameters"):
        run(conn, "EXPLAIN SELECT count(*) AS n FROM trips WHERE a > ? AND a < ?", (5,))
