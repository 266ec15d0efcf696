"""The twenty queries through the real ADBC driver against real daemons (a catalog and three nodes as child
processes), each answer equal to DuckDB's over the same tables; tests/test_flight_sql.py runs the same queries and
the rest of Flight SQL against the same servers inside the test process, where its tests can change their limits."""

from __future__ import annotations

import pytest

import flightpart as fp
from flightpart.bench.queries import canonical, same_answer, taxi_table
from flightpart.bench.sql_queries import SQL_QUERIES, duckdb_over, zones_table
from flightpart.bench.sql_queries import through_driver as answer

dbapi = pytest.importorskip("adbc_driver_flightsql.dbapi", reason="adbc-driver-flightsql is in the test extra")

PROCESS_CLUSTER = True  # the catalog and the nodes are daemons, as `flightpart catalog` and `serve` run them


def test_the_twenty_queries_answer_what_duckdb_answers_through_real_daemons(cluster):
    table, zones = taxi_table(30_000, seed=5), zones_table()
    with fp.connect(cluster.uri) as writer:
        writer.put("trips", table, tiling=(6, 1))
        writer.put("zones", zones)
    local = duckdb_over(table, zones)
    wrong = []
    with dbapi.connect(cluster.uri) as conn:
        for name, sql in sorted(SQL_QUERIES.items()):
            got, want = answer(conn, sql), local.sql(sql).to_arrow_table()
            if got.column_names != want.column_names or not same_answer(canonical(got), canonical(want)):
                wrong.append(name)
    assert wrong == []
    assert all(n.proc.poll() is None for n in [cluster.catalog, *cluster.nodes])  # every daemon still serving
