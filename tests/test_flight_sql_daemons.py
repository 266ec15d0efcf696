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


def test_a_long_in_list_runs_whole_and_deep_nesting_is_refused_and_no_daemon_dies(cluster):
    """An IN list of 20,000 values, pushed to the nodes as a filter, killed them (12,000) or the catalog (20,000):
    Arrow's Substrait reader recurses as deep as the list. A list longer than the nodes take runs whole (DuckDB's
    answer); a query nested past what sqlglot reads is refused with a code, not INTERNAL."""
    import pyarrow as pa

    with fp.connect(cluster.uri) as client:
        client.put("ids", pa.table({"id": list(range(30_000)), "v": [k % 7 for k in range(30_000)]}), tiling=(3, 1))
        wanted = ", ".join(str(k) for k in range(0, 40_000, 2))
        got = client.sql(f"SELECT count(*) AS n, sum(v) AS s FROM ids WHERE id IN ({wanted})").to_arrow()
        assert got.to_pylist() == [{"n": 15_000, "s": sum(k % 7 for k in range(0, 30_000, 2))}]
        with pytest.raises(fp.RequestRejected, match="nested too deeply") as caught:
            client.sql("SELECT " + "(" * 200 + "id" + ")" * 200 + " FROM ids").to_arrow()
        assert caught.value.code == "INVALID_REQUEST"
        assert client.sql("SELECT count(*) AS n FROM ids").to_arrow().column("n").to_pylist() == [30_000]
    assert all(n.proc.poll() is None for n in [cluster.catalog, *cluster.nodes])


def test_metadata_requests_cost_what_they_answer(cluster):
    """A table pattern of 40 '%' froze the catalog for minutes (a regular expression backtracking with the
    interpreter held); a GetSqlInfo naming one id a million times made a 15 MB request a 362 MB answer."""
    import pyarrow as pa
    import pyarrow.flight as flight

    from flightpart import sqlwire

    def command(name: str, *fields) -> flight.FlightDescriptor:
        return flight.FlightDescriptor.for_command(sqlwire.pack(name, sqlwire.message(*fields)))

    with fp.connect(cluster.uri) as writer:
        writer.put("trips", pa.table({"a": [1, 2]}))
        writer.put("a" * 30, pa.table({"a": [1, 2]}))  # a name the pattern below made backtrack past any patience
    raw = flight.connect(cluster.uri)
    within = flight.FlightCallOptions(timeout=60)  # the backtracking took hours; the answer takes milliseconds

    def answer(descriptor: flight.FlightDescriptor) -> pa.Table:
        return raw.do_get(raw.get_flight_info(descriptor, within).endpoints[0].ticket, within).read_all()

    assert answer(command(sqlwire.GET_TABLES, (3, "%" * 40 + "x"))).num_rows == 0
    assert answer(command(sqlwire.GET_TABLES, (3, "%t%r%i%p%s%"))).column("table_name").to_pylist() == ["trips"]
    with pytest.raises(pa.ArrowException, match="more than the 256 a pattern may have.*INVALID_REQUEST"):
        answer(command(sqlwire.GET_TABLES, (3, "%" * 257)))
    million = sqlwire.pack(sqlwire.GET_SQL_INFO, b"".join(sqlwire.message((1, 0)) for _ in range(1_000_000)))
    assert answer(flight.FlightDescriptor.for_command(million)).num_rows == 1
    assert all(n.proc.poll() is None for n in [cluster.catalog, *cluster.nodes])


def test_a_query_text_past_its_limit_is_refused_before_it_is_read(cluster):
    """A 4.5 MB query took the catalog a minute and 2.7 GB before DuckDB refused it: past 1 Mi characters a query
    is refused LIMIT_EXCEEDED, read by nothing."""
    from flightpart.sql.server import MAX_QUERY_CHARACTERS

    with fp.connect(cluster.uri) as client:
        columns = ", ".join(f"1 + {k} AS c{k}" for k in range(MAX_QUERY_CHARACTERS // 12))
        with pytest.raises(fp.LimitExceeded, match="a query may have") as caught:
            client.sql(f"SELECT {columns}").to_arrow()
        assert caught.value.code == "LIMIT_EXCEEDED"
        assert client.sql("SELECT 1 AS one").to_arrow().column("one").to_pylist() == [1]
