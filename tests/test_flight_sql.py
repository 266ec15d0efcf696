"""Flight SQL at the catalog, through the real ADBC driver (DB-API): answers equal DuckDB's over the same table,
metadata lists datasets with their schemas, selective filters reach the nodes, and bad SQL is a clear error after
which the catalog keeps answering."""

from __future__ import annotations

import time

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart import sqlwire
from flightpart.bench.queries import canonical, same_answer, taxi_table
from flightpart.bench.sql_queries import SQL_QUERIES, duckdb_over, zones_table
from flightpart.bench.sql_queries import through_driver as answer
from flightpart.errors import FlightpartError

from helpers import code_of

dbapi = pytest.importorskip("adbc_driver_flightsql.dbapi", reason="adbc-driver-flightsql is in the test extra")

ROWS = 60_000
QUERIES = SQL_QUERIES


@pytest.fixture(scope="module")
def taxi(cluster):
    table = taxi_table(ROWS, seed=11)
    zones = zones_table()
    with fp.connect(cluster.uri) as writer:
        writer.put("trips", table, tiling=(6, 1))
        writer.put("zones", zones)
    with dbapi.connect(cluster.uri) as conn:
        yield table, zones, conn


def local(trips: pa.Table, zones: pa.Table | None = None) -> duckdb.DuckDBPyConnection:
    """DuckDB over the same tables, under the same names: the answers to match."""
    return duckdb_over(trips, zones if zones is not None else zones_table())


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_every_query_answers_what_duckdb_answers_over_the_table(taxi, name):
    table, zones, conn = taxi
    got = answer(conn, QUERIES[name])
    want = local(table, zones).sql(QUERIES[name]).to_arrow_table()
    assert got.column_names == want.column_names
    assert same_answer(canonical(got), canonical(want)), name


def test_parameters_are_bound_as_the_db_api_binds_them(taxi):
    table, _zones, conn = taxi
    sql = "SELECT count(*) AS n, sum(fare) AS fare FROM trips WHERE pickup_zone = ? AND fare > ?"
    with conn.cursor() as cur:
        cur.execute(sql, parameters=("Hell's Kitchen", 30.0))
        got = cur.fetch_arrow_table()
    want = local(table).sql(sql, params=["Hell's Kitchen", 30.0]).to_arrow_table()
    assert same_answer(canonical(got), canonical(want)) and got.column("n")[0].as_py() > 0
    with conn.cursor() as cur:
        with pytest.raises(dbapi.Error, match="parameter"):
            cur.execute(sql)  # no values bound
        with pytest.raises(dbapi.Error, match="queries only"):
            cur.executemany("SELECT count(*) FROM trips WHERE fare > ?", [(1.0,), (2.0,)])


def test_a_query_that_runs_too_long_is_stopped_with_a_clear_error(taxi, cluster):
    _table, _zones, conn = taxi
    gateway = cluster.catalog.gateway
    saved, gateway.timeout = gateway.timeout, 0.5
    try:
        with pytest.raises(dbapi.Error, match="ran longer than the 0.5 s") as info:
            answer(conn, "SELECT count(*) FROM range(100000000000) a")
        adbc = pytest.importorskip("adbc_driver_manager")
        assert info.value.status_code == adbc.AdbcStatusCode.TIMEOUT  # DEADLINE_EXCEEDED, as SQL clients expect
    finally:
        gateway.timeout = saved
    assert answer(conn, "SELECT 2 AS two").column("two").to_pylist() == [2]


def test_an_answer_larger_than_the_catalog_holds_is_refused_with_a_code(taxi, cluster, monkeypatch):
    _table, _zones, conn = taxi
    monkeypatch.setattr(cluster.catalog.answers, "per_answer", 1_000)
    with pytest.raises(dbapi.Error, match="passed 1,000 bytes"):
        answer(conn, "SELECT fare, tip FROM trips ORDER BY fare")  # sorted: answered by the catalog, not the nodes
    assert answer(conn, "SELECT count(*) AS n FROM trips").column("n").to_pylist() == [ROWS]


def test_partials_past_the_catalogs_budget_run_the_query_whole_and_right(taxi, cluster, monkeypatch):
    """A GROUP BY on a key with about as many values as rows would have the nodes send about the rows as partials,
    held at the catalog outside DuckDB's memory limit: past PARTIAL_BYTES the query runs whole (DuckDB aggregating
    the scans within its limit), and answers the same; a GROUP BY with few groups still runs on the nodes."""
    from flightpart.sql import pushed

    _table, _zones, conn = taxi
    monkeypatch.setattr(pushed, "PARTIAL_BYTES", 50_000)
    many = ("SELECT pickup_at, count(*) AS n, sum(fare) AS f FROM trips GROUP BY pickup_at "
            "ORDER BY n DESC, pickup_at LIMIT 5")
    rows_moved_answering(taxi, cluster, many)
    assert answer(conn, "EXPLAIN " + many).to_pylist()[0]["step"] != "aggregate"
    few = "SELECT payment, count(*) AS n FROM trips GROUP BY payment ORDER BY payment"
    assert rows_moved_answering(taxi, cluster, few) <= 4 * 6
    assert answer(conn, "EXPLAIN " + few).to_pylist()[0]["step"] == "aggregate"
    with fp.connect(cluster.uri) as client, pytest.raises(fp.LimitExceeded, match="max_bytes=10,000"):
        client.open("trips").aggregate([("fare", "sum")], by="pickup_at", max_bytes=10_000)


def test_a_version_is_a_table_too(taxi, cluster):
    table, _zones, conn = taxi
    with fp.connect(cluster.uri) as writer:
        first = writer.open("trips").version
        writer.append("trips", table.slice(0, 10))
        try:
            assert answer(conn, f'SELECT count(*) AS n FROM "trips@{first}"').column("n")[0].as_py() == ROWS
            assert answer(conn, "SELECT count(*) AS n FROM trips").column("n")[0].as_py() == ROWS + 10
        finally:
            writer.put("trips", table, tiling=(6, 1))  # back to the fixture's rows for the other tests


def test_metadata_lists_every_dataset_with_its_schema(taxi):
    table, zones, conn = taxi
    objects = conn.adbc_get_objects().read_all().to_pylist()
    tables = {t["table_name"]: [c["column_name"] for c in t["table_columns"]]
              for catalog in objects for schema in catalog["catalog_db_schemas"] for t in schema["db_schema_tables"]}
    assert tables["trips"] == table.column_names and tables["zones"] == zones.column_names
    assert conn.adbc_get_table_schema("trips").equals(table.schema)
    assert conn.adbc_get_table_types() == ["TABLE"]


def test_table_names_are_listed_without_asking_each_datasets_schema(taxi, cluster, monkeypatch):
    """GetTables asked the catalog for every dataset's schema, whether the client wanted schemas or not and before its
    name pattern was applied: a client listing names over many datasets paid a call for each. Names are listed from
    the catalog's list alone, and only the datasets a pattern keeps are asked for their schemas."""
    from flightpart.client.client import Client

    _table, zones, conn = taxi
    asked: list[str] = []
    real = Client.info
    monkeypatch.setattr(Client, "info",
                        lambda self, name, version=None: asked.append(name) or real(self, name, version))
    objects = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
    names = {t["table_name"] for catalog in objects for schema in catalog["catalog_db_schemas"]
             for t in schema["db_schema_tables"]}
    assert {"trips", "zones"} <= names and asked == []
    objects = conn.adbc_get_objects(depth="columns", table_name_filter="zon%").read_all().to_pylist()
    tables = {t["table_name"]: [c["column_name"] for c in t["table_columns"]]
              for catalog in objects for schema in catalog["catalog_db_schemas"] for t in schema["db_schema_tables"]}
    assert tables == {"zones": zones.column_names} and asked == ["zones"]


def test_a_selective_filter_reaches_the_nodes(taxi, cluster):
    table, _zones, conn = taxi
    sent = lambda: sum(fp.connect(cluster.uri).stats(n.uri).values["bytes_sent"] for n in cluster.nodes)  # noqa: E731
    before = sent()
    hour = answer(conn, "SELECT count(*) AS n FROM trips WHERE pickup_at >= TIMESTAMP '2024-01-08 10:00' "
                        "AND pickup_at < TIMESTAMP '2024-01-08 11:00'")
    moved = sent() - before
    assert hour.column("n")[0].as_py() == local(table).sql(
        "SELECT count(*) FROM trips WHERE pickup_at >= TIMESTAMP '2024-01-08 10:00' AND pickup_at < "
        "TIMESTAMP '2024-01-08 11:00'").fetchall()[0][0] > 0
    assert moved < 0.05 * table.nbytes, f"{moved:,} of {table.nbytes:,} bytes moved"


def rows_moved_answering(taxi, cluster, sql: str, places: pa.Table | None = None) -> int:
    """Rows the nodes sent while ``sql`` was answered through the driver; the answer is checked against DuckDB's
    over the tables (``places``, when given, standing as ``zones`` does for the small dataset)."""
    table, _zones, conn = taxi
    rows = lambda: sum(fp.connect(cluster.uri).stats(n.uri).values["rows_sent"] for n in cluster.nodes)  # noqa: E731
    before = rows()
    got = answer(conn, sql)
    moved = rows() - before
    over = local(table) if places is None else duckdb_over(table, places)
    want = over.sql(sql if places is None else sql.replace("places", "zones")).to_arrow_table()
    assert got.schema.equals(want.schema), (got.schema, want.schema)
    assert same_answer(canonical(got), canonical(want))
    return moved


def test_a_group_by_moves_one_row_per_group_and_partition(taxi, cluster):
    moved = rows_moved_answering(taxi, cluster, (
        "SELECT payment, count(*) AS n, avg(fare) AS fare, sum(vendor) AS vendors, max(pickup_at) AS last FROM trips "
        "WHERE distance > 1 AND pickup_zone <> 'SoHo' GROUP BY payment HAVING count(*) > 10 ORDER BY n DESC"))
    assert moved <= 4 * 6, f"{moved} rows moved for 4 groups over 6 partitions"


def test_a_count_distinct_moves_one_row_per_group_value_and_partition(taxi, cluster):
    table = taxi[0]
    moved = rows_moved_answering(taxi, cluster, (
        "SELECT payment, count(DISTINCT pickup_zone) AS zones FROM trips WHERE fare > 5 GROUP BY payment "
        "HAVING count(DISTINCT pickup_zone) > 1 ORDER BY payment"))
    groups = local(table).sql("SELECT count(*) FROM (SELECT DISTINCT payment, pickup_zone FROM trips WHERE fare > 5)"
                              ).fetchall()[0][0]
    assert moved <= groups * 6 < table.num_rows, (f"{moved} rows moved for {groups} (payment, zone) pairs "
                                                  "over 6 partitions")


def test_a_count_distinct_beside_other_aggregates_moves_one_row_per_group_value_and_partition(taxi, cluster):
    """The other aggregates are taken by the group keys on the nodes, the distinct count by the keys and its column;
    the catalog finishes them by the keys. Types as DuckDB gives them (a sum of integers a HUGEINT, counts BIGINT,
    avg of integers DOUBLE)."""
    table = taxi[0]
    moved = rows_moved_answering(taxi, cluster, (
        "SELECT payment, sum(fare) AS s, avg(tip) AS a, avg(passengers) AS p, min(distance) AS lo, "
        "max(pickup_at) AS last, count(passengers) AS c, count(*) AS n, sum(vendor) AS vendors, count(DISTINCT "
        "pickup_zone) AS zones FROM trips WHERE fare > 5 GROUP BY payment HAVING count(*) > 10 AND count(DISTINCT "
        "pickup_zone) > 1 ORDER BY n DESC"))
    pairs = local(table).sql("SELECT count(*) FROM (SELECT DISTINCT payment, pickup_zone FROM trips WHERE fare > 5)"
                             ).fetchall()[0][0]
    assert moved <= (4 + pairs) * 6 < table.num_rows, (
        f"{moved} rows moved for 4 groups and {pairs} (payment, zone) pairs over 6 partitions")
    moved = rows_moved_answering(taxi, cluster, (  # no GROUP BY: one group
        "SELECT count(DISTINCT payment) AS kinds, sum(fare) AS s, count(*) AS n FROM trips"))
    assert moved <= (1 + 4) * 6


def test_several_distinct_counts_move_one_row_per_group_value_and_partition_each(taxi, cluster):
    """Each count(DISTINCT ...) is a grouping of its own on the nodes (by the keys and its columns), the other
    aggregates one by the keys alone: the rows moved are the sum of those groupings' groups per partition, never the
    product of the distinct columns' values. ``count(DISTINCT (a, b))`` counts combinations, a tuple of NULLs too."""
    table = taxi[0]
    sql = ("SELECT payment, count(DISTINCT pickup_zone) AS zones, count(DISTINCT dropoff_zone) AS dropoffs, "
           "count(DISTINCT (vendor, passengers)) AS kinds, count(DISTINCT passengers) AS sizes, sum(fare) AS s, "
           "avg(tip) AS a, count(*) AS n FROM trips WHERE fare > 5 GROUP BY payment "
           "HAVING count(DISTINCT dropoff_zone) > 1 ORDER BY n DESC")
    moved = rows_moved_answering(taxi, cluster, sql)
    groups = lambda columns: local(table).sql(  # noqa: E731
        f"SELECT count(*) FROM (SELECT DISTINCT payment, {columns} FROM trips WHERE fare > 5)").fetchall()[0][0]
    most = 6 * (4 + groups("pickup_zone") + groups("dropoff_zone") + groups("vendor, passengers")
                + groups("passengers"))
    together = groups("pickup_zone, dropoff_zone, vendor, passengers")
    assert moved <= most < together, (f"{moved} rows moved, {most} at most, {together} if grouped by every "
                                      "column at once")
    moved = rows_moved_answering(taxi, cluster, (  # no GROUP BY: one group
        "SELECT count(DISTINCT payment) AS kinds, count(DISTINCT vendor) AS vendors, count(*) AS n FROM trips"))
    assert moved <= 6 * (1 + 4 + 2)


def test_grouping_by_and_aggregating_expressions_moves_one_row_per_group_and_partition(taxi, cluster):
    """``date_trunc`` keys and arithmetic inside aggregates are computed by the nodes before they group (by position,
    alias or the expression written again); the answer is DuckDB's, named and typed as DuckDB names it."""
    table, _zones, conn = taxi
    sql = ("SELECT date_trunc('day', pickup_at) AS day, payment, sum(fare * 100) AS cents, avg(tip + fare) AS total, "
           "max(vendor * 2) AS v, sum(passengers - 1) AS extra FROM trips WHERE distance > 1 GROUP BY 1, payment "
           "HAVING count(*) > 1 ORDER BY day, payment")
    moved = rows_moved_answering(taxi, cluster, sql)
    groups = local(table).sql("SELECT count(*) FROM (SELECT DISTINCT date_trunc('day', pickup_at), payment FROM trips "
                              "WHERE distance > 1)").fetchall()[0][0]
    assert moved <= groups * 6 < table.num_rows, (f"{moved} rows moved for {groups} (day, payment) groups "
                                                  "over 6 partitions")
    moved = rows_moved_answering(taxi, cluster, (
        "SELECT date_trunc('week', pickup_at), count(*) AS n FROM trips GROUP BY date_trunc('week', pickup_at) "
        "ORDER BY date_trunc('week', pickup_at)"))
    assert moved <= 6 * 6
    explained = answer(conn,
                       "EXPLAIN SELECT date_trunc('month', pickup_at) AS m, sum(fare * 100) FROM trips GROUP BY m")
    steps = explained.to_pylist()
    assert steps[0]["step"] == "aggregate" and "DATE_TRUNC('MONTH', pickup_at)" in steps[0]["what"], steps


@pytest.mark.parametrize("sql", [
    # nothing left after WHERE, no GROUP BY: counts are 0, sums NULL; unaliased columns named as DuckDB names them
    "SELECT count(DISTINCT pickup_zone), count(*), count(passengers), sum(fare), avg(tip) FROM trips WHERE fare > 1e9",
    "SELECT payment, count(*), sum(fare) FROM trips GROUP BY payment ORDER BY payment",
    "SELECT count(DISTINCT payment), count(DISTINCT (vendor, passengers)), count(*), avg(tip) FROM trips "
    "WHERE fare > 1e9",
    # an aggregate's FILTER clause filters its input rows: such queries are answered whole, and answered right
    "SELECT payment, avg(fare) FILTER (WHERE tip > 5) AS a, count(DISTINCT pickup_zone) AS z FROM trips "
    "GROUP BY payment",
    "SELECT payment, count(*) FILTER (WHERE tip > 5) AS n, sum(fare) FILTER (WHERE fare > 5) AS s FROM trips "
    "GROUP BY payment",
])
def test_partial_aggregates_answer_edge_cases_as_duckdb_does(taxi, sql):
    table, zones, conn = taxi
    got = answer(conn, sql)
    want = local(table, zones).sql(sql).to_arrow_table()
    assert got.schema.equals(want.schema), (got.schema, want.schema)
    assert same_answer(canonical(got), canonical(want))


def test_floating_point_keys_group_as_duckdb_groups_them(cluster):
    """pyarrow groups -0.0 apart from 0.0 and DuckDB does not: a GROUP BY or count(DISTINCT) of a float column is
    answered whole, as DuckDB answers it."""
    values = pa.table({"x": pa.array([0.0, -0.0, 1.0, float("nan"), -0.0, 2.5] * 10), "k": [1, 2, 1, 2, 1, 2] * 10})
    with fp.connect(cluster.uri) as writer:
        writer.put("zeros", values, tiling=(3, 1))
    with dbapi.connect(cluster.uri) as conn:
        for sql in ("SELECT k, count(DISTINCT x) AS d, count(*) AS n FROM zeros GROUP BY k ORDER BY k",
                    "SELECT x, count(*) AS n FROM zeros GROUP BY x ORDER BY x"):
            got = answer(conn, sql)
            want = duckdb.connect().sql(sql.replace("zeros", "values")).to_arrow_table()
            assert got.to_pylist() == want.to_pylist() or same_answer(canonical(got), canonical(want)), sql


@pytest.fixture(scope="module")
def places(cluster, taxi):
    """A small dataset with a zone listed twice and a NULL zone: a join multiplies and drops rows by it."""
    rows = pa.table({"zone": ["JFK Airport", "LaGuardia", "JFK Airport", "Midtown", None, "Nowhere"],
                     "borough": ["Queens", "Queens", "Airports", "Manhattan", "Unknown", "Nowhere"]})
    with fp.connect(cluster.uri) as writer:
        writer.put("places", rows)
    return rows


@pytest.mark.parametrize("sql", [
    "SELECT p.borough, count(*) AS n FROM trips JOIN places p ON p.zone = trips.pickup_zone GROUP BY p.borough",
    "SELECT p.zone, count(t.fare) AS n, count(*) AS rows FROM places p LEFT JOIN trips t "
    "ON t.pickup_zone = p.zone AND t.fare > 60 GROUP BY p.zone",
    "SELECT p.borough, t.payment, sum(t.fare) AS s, avg(t.tip) AS a, avg(passengers) AS people, "
    "min(t.pickup_at) AS first, max(distance) AS far, sum(vendor) AS vendors, count(DISTINCT t.dropoff_zone) AS "
    "d, count(*) AS n FROM trips t JOIN places p ON t.pickup_zone = p.zone WHERE t.fare > 10 AND p.borough <> 'Queens' "
    "GROUP BY p.borough, t.payment HAVING count(*) > 5 ORDER BY s DESC",
    "SELECT p.borough, count(passengers) AS c, count(*) AS n FROM trips t LEFT JOIN places p ON t.pickup_zone = p.zone "
    "GROUP BY p.borough ORDER BY 1",
    "SELECT count(*) AS n, sum(fare) AS s FROM places JOIN trips ON places.zone = trips.dropoff_zone WHERE fare > 1e9",
])
def test_aggregates_over_a_join_run_on_the_nodes_before_it(taxi, cluster, places, sql):
    """Every aggregate reads trips: the nodes aggregate trips by its join column (and its own group keys, and the
    distinct column), one row per zone and partition, and DuckDB joins those rows with the small dataset. A zone
    listed twice counts its trips twice, a NULL zone matches nothing, a left join keeps unmatched rows (counted
    once by count(*)), exactly as DuckDB answers over the tables themselves."""
    table, _zones, conn = taxi
    moved = rows_moved_answering(taxi, cluster, sql, places)
    most = 6 * 12 * (12 if "DISTINCT t.dropoff_zone" in sql else 1) * (4 if "t.payment" in sql else 1) + places.num_rows
    assert moved <= most < table.num_rows, f"{moved} rows moved, {most} at most (zones and keys per partition, places)"
    steps = answer(conn, f"EXPLAIN {sql}").to_pylist()
    assert steps[0]["step"] == "aggregate" and steps[0]["what"].startswith("trips: partial aggregates")


@pytest.mark.parametrize("sql", [
    # a condition on the side a left join may leave NULL, in WHERE: it drops the unmatched rows, so it runs whole
    "SELECT p.zone, avg(t.fare) AS a FROM places p LEFT JOIN trips t ON t.pickup_zone = p.zone WHERE t.fare > 30 "
    "GROUP BY p.zone",
    # a condition in ON on the side a left join keeps whole filters matches, not its rows
    "SELECT p.borough, count(*) AS n FROM trips t LEFT JOIN places p ON t.pickup_zone = p.zone AND t.fare > 50 "
    "GROUP BY p.borough",
    "SELECT p.borough, sum(t.fare) AS s FROM trips t RIGHT JOIN places p ON t.pickup_zone = p.zone GROUP BY p.borough",
])
def test_joins_the_nodes_cannot_aggregate_first_are_answered_whole_and_right(taxi, places, sql):
    table, _zones, conn = taxi
    got = answer(conn, sql)
    want = duckdb_over(table, places).sql(sql.replace("places", "zones")).to_arrow_table()
    assert same_answer(canonical(got), canonical(want))
    assert [s["step"] for s in answer(conn, f"EXPLAIN {sql}").to_pylist()] == ["scan", "query"]


@pytest.mark.parametrize("sql, most", [
    # the small dataset's zones go to the nodes as an IN list: one row per partition comes back
    ("SELECT count(*) AS n, sum(fare) AS s FROM trips WHERE pickup_zone IN (SELECT zone FROM places "
     "WHERE borough = 'Queens')", 6),
    ("SELECT payment, avg(tip) AS a FROM trips WHERE pickup_zone NOT IN (SELECT zone FROM places WHERE "
     "zone IS NOT NULL) GROUP BY payment ORDER BY payment", 4 * 6),
    ("SELECT fare, pickup_zone FROM trips WHERE dropoff_zone IN (SELECT zone FROM places WHERE borough = 'Queens') "
     "ORDER BY fare DESC, pickup_at LIMIT 4", 4 * 6),
    # aggregated WITH queries and derived tables are answered on the nodes first
    ("WITH busy AS (SELECT pickup_zone, count(*) AS n FROM trips GROUP BY pickup_zone) "
     "SELECT max(n) AS most, min(n) AS least FROM busy", 12 * 6),
    ("SELECT p.borough, sum(s.n) AS n FROM (SELECT pickup_zone, count(*) AS n FROM trips WHERE fare > 20 "
     "GROUP BY pickup_zone) AS s JOIN places p ON p.zone = s.pickup_zone GROUP BY p.borough ORDER BY n", 12 * 6),
])
def test_small_subqueries_and_aggregated_with_queries_are_answered_first(taxi, cluster, places, sql, most):
    """The subquery (over the small dataset) runs first at the catalog and the large dataset's part runs on the
    nodes with its values; a WITH query the nodes aggregate is answered there and read as a table. Answers equal
    DuckDB's over the tables, rows moved bounded by groups and partitions (plus the small dataset's rows)."""
    table, _zones, conn = taxi
    moved = rows_moved_answering(taxi, cluster, sql, places)
    assert moved <= most + places.num_rows < table.num_rows, f"{moved} rows moved, {most} + {places.num_rows} at most"
    steps = answer(conn, f"EXPLAIN {sql}").to_pylist()
    assert steps[0]["step"] == "first" and steps[-1]["rows"] == answer(conn, sql).num_rows, steps


def test_a_correlated_subquery_or_one_with_a_null_is_answered_whole_and_right(taxi, places):
    table, _zones, conn = taxi
    for sql in ("SELECT count(*) AS n FROM trips t WHERE pickup_zone IN (SELECT zone FROM places p "
                "WHERE p.zone = t.dropoff_zone)",
                "SELECT count(*) AS n FROM trips WHERE pickup_zone NOT IN (SELECT zone FROM places)"):
        got = answer(conn, sql)
        want = duckdb_over(table, places).sql(sql.replace("places", "zones")).to_arrow_table()
        assert same_answer(canonical(got), canonical(want)), sql
        assert "first" not in [s["step"] for s in answer(conn, f"EXPLAIN {sql}").to_pylist()]


@pytest.fixture(scope="module")
def extremes(cluster):
    """Integers whose sums pass 2**63 and 2**53, a float column with NaN, names a query's aliases can collide with."""
    rows = pa.table({"g": ["a", "a", "b", "b"], "big": pa.array([2**62, 2**62, 10**16, 5], pa.int64()),
                     "flag": [True, True, False, True], "rating": [1.5, float("nan"), 2.0, 0.5],
                     "fare": [1.0, 2.0, 3.0, 4.0], "u": pa.array([1, 2, 3, 250], pa.uint8())})
    with fp.connect(cluster.uri) as writer:
        writer.put("extremes", rows, tiling=(2, 1))
    return rows


@pytest.mark.parametrize("sql", [
    # Arrow's int64 sum wraps past 2**63; DuckDB sums into a HUGEINT (and an average of them into a double)
    "SELECT sum(big) AS s, avg(big) AS a FROM extremes",
    "SELECT g, sum(big) AS s, avg(big) AS a, sum(flag) AS f, count(DISTINCT fare) AS d FROM extremes GROUP BY g",
    "SELECT g, sum(big) // 7 AS s, typeof(sum(big)) AS t FROM extremes GROUP BY g",
    # DuckDB ranks NaN above every number; Arrow's max skips it
    "SELECT g, max(rating) AS hi, min(rating) AS lo FROM extremes GROUP BY g",
    # an alias named as a partial column, in HAVING and in the SELECT list
    "SELECT g, sum(fare) AS total, max(fare) AS fare_sum FROM extremes GROUP BY g HAVING fare_sum > 3",
    "SELECT g, count(*) AS n, max(fare) AS count_all FROM extremes GROUP BY g HAVING count_all > 3",
    # min(x, n) is a list of the n smallest; count_star() and fsum are aggregates sqlglot does not know
    "SELECT g, min(fare, 2) AS two FROM extremes GROUP BY g",
    "SELECT count(DISTINCT g) AS d, count_star() AS n, fsum(fare) AS f FROM extremes",
    # a table alias renaming its columns
    "SELECT max(fare) AS m FROM extremes AS e(fare)",
    # a WITH query answered first keeps DuckDB's types for the rest of the query
    "WITH s AS (SELECT g, sum(big) AS sb FROM extremes GROUP BY g) SELECT g, typeof(sb) AS t, sb // 7 AS q FROM s",
    # a WITH query named as the dataset in other letters hides it (DuckDB's names are case-insensitive)
    "WITH Extremes AS (SELECT g, count(*) AS fare FROM extremes GROUP BY g) SELECT max(fare) AS m FROM extremes",
    # subqueries of every kind read the datasets themselves, not what the plans read
    "SELECT count(*) AS n, EXISTS (SELECT 1 FROM extremes WHERE g = 'zz') AS e FROM extremes",
    "SELECT g, count(*) AS n FROM extremes GROUP BY g HAVING EXISTS (SELECT * FROM extremes WHERE fare > 3)",
    "SELECT g, count(*) AS n, ARRAY(SELECT fare FROM extremes ORDER BY fare) AS a FROM extremes GROUP BY g",
    "SELECT *, count(*) AS n FROM extremes GROUP BY ALL",
    # an IN list whose value does not fit the column's type (-1 for a uint8): answered whole, not an error
    "SELECT count(*) AS n FROM extremes WHERE u IN (SELECT -1)",
    "SELECT e.g, count(*) AS n FROM extremes e GROUP BY g",
])
def test_partial_aggregates_answer_as_duckdb_at_the_edges_of_their_types(cluster, extremes, sql):
    with dbapi.connect(cluster.uri) as conn:
        got = answer(conn, sql)
    over = duckdb.connect()
    over.register("extremes", extremes)
    want = over.sql(sql).to_arrow_table()
    assert got.schema.equals(want.schema), (got.schema, want.schema)
    assert same_answer(canonical(got), canonical(want)), (got.to_pylist(), want.to_pylist())


def test_a_query_rewritten_to_run_on_the_nodes_answers_with_the_names_and_types_written(taxi, places):
    """An IN subquery answered first makes the query printed anew; the answer keeps DuckDB's names for the query
    as written (``CAST(fare AS VARCHAR)``, not sqlglot's ``CAST(fare AS TEXT)``); and a subquery DuckDB would refuse
    for its types is refused, not answered from literal values."""
    table, _zones, conn = taxi
    sql = ("SELECT pickup_zone, fare::VARCHAR, len(payment) FROM trips "
           "WHERE pickup_zone IN (SELECT zone FROM places WHERE borough = 'Queens') ORDER BY fare LIMIT 5")
    got = answer(conn, sql)
    want = duckdb_over(table, places).sql(sql.replace("places", "zones")).to_arrow_table()
    assert got.schema.equals(want.schema) and same_answer(canonical(got), canonical(want)), (got.schema, want.schema)
    with pytest.raises(dbapi.Error, match="(?i)cannot compare values of type"):
        answer(conn, "SELECT count(*) FROM trips WHERE vendor IN (SELECT zone FROM places)")
    assert answer(conn, "SELECT 1 AS one").column("one").to_pylist() == [1]


def test_explain_after_a_comment_explains(taxi):
    _table, _zones, conn = taxi
    steps = answer(conn, "/* why */ -- and how\nEXPLAIN SELECT count(*) FROM trips").to_pylist()
    assert [s["step"] for s in steps] == ["aggregate", "finish"]


def test_a_plain_scan_is_read_from_the_nodes_one_endpoint_per_partition(taxi, cluster):
    import pyarrow.flight as flight

    from flightpart import sqlwire

    table, _zones, conn = taxi
    sql = "SELECT fare, pickup_zone FROM trips WHERE pickup_zone = 'Hell''s Kitchen' AND fare > 40"
    command = sqlwire.pack(sqlwire.STATEMENT_QUERY, sqlwire.message((1, sql)))
    info = flight.connect(cluster.uri).get_flight_info(flight.FlightDescriptor.for_command(command))
    nodes = {n.uri for n in cluster.nodes}
    assert len(info.endpoints) == 6 and all(e.locations[0].uri.decode() in nodes for e in info.endpoints)
    got = answer(conn, sql)
    want = local(table).sql(sql).to_arrow_table()
    assert got.column_names == ["fare", "pickup_zone"]
    assert sorted(got.to_pylist(), key=str) == sorted(want.to_pylist(), key=str) and got.num_rows > 0


def test_explain_says_what_ran_where_and_the_bytes_it_moved(taxi):
    table, _zones, conn = taxi
    grouped = answer(conn, "EXPLAIN SELECT payment, count(*) AS n FROM trips GROUP BY payment").to_pylist()
    assert [(s["step"], s["where"]) for s in grouped] == [("aggregate", "nodes"), ("finish", "catalog (DuckDB)")]
    assert grouped[0]["bytes_moved"] < 0.01 * table.nbytes and grouped[1]["rows"] == 4
    joined = answer(conn,
                    "EXPLAIN SELECT z.borough, count(*) AS n FROM trips JOIN zones z ON z.zone = trips.pickup_zone "
                    "GROUP BY z.borough").to_pylist()
    assert [s["step"] for s in joined] == ["aggregate", "finish"] and "by pickup_zone" in joined[0]["what"]
    assert "JOIN zones" in joined[1]["what"] and joined[0]["bytes_moved"] < 0.01 * table.nbytes
    windowed = answer(conn, "EXPLAIN SELECT payment, rank() OVER (ORDER BY fare) AS r FROM trips "
                            "QUALIFY r < 3").to_pylist()
    assert [s["step"] for s in windowed] == ["scan", "query"] and "trips" in windowed[0]["what"]
    assert 0 < windowed[0]["bytes_moved"] < table.nbytes / 2  # two of twelve columns
    scanned = answer(conn, "EXPLAIN SELECT fare FROM trips WHERE fare > 40").to_pylist()
    assert scanned[0]["where"] == "nodes" and "6 partition(s)" in scanned[0]["what"]
    distinct = answer(conn, "EXPLAIN SELECT payment, count(DISTINCT pickup_zone) AS z, count(DISTINCT vendor) AS v, "
                            "sum(fare) AS s FROM trips GROUP BY payment").to_pylist()
    assert (distinct[0]["step"] == "aggregate"
            and "by payment; count(*) by payment, pickup_zone; " in distinct[0]["what"])
    # a filter flightpart cannot express: the plans would push the work, but it ran at the catalog, and EXPLAIN says so
    for sql in ("SELECT fare FROM trips WHERE lower(payment) = 'cash' ORDER BY fare LIMIT 3",
                "SELECT payment, count(*) AS n FROM trips WHERE lower(payment) = 'cash' GROUP BY payment"):
        assert [s["step"] for s in answer(conn, f"EXPLAIN {sql}").to_pylist()] == ["scan", "query"], sql


def test_adbc_ingest_stores_a_dataset_appends_and_replaces(cluster):
    rows = pa.table({"k": list(range(1_000)), "v": [f"v{k % 3}" for k in range(1_000)]})
    with dbapi.connect(cluster.uri) as conn, conn.cursor() as cur, fp.connect(cluster.uri) as client:
        assert cur.adbc_ingest("ingested", rows, mode="create") == 1_000
        assert client.open("ingested").to_arrow().equals(rows)
        assert cur.adbc_ingest("ingested", rows.slice(0, 10), mode="append") == 10
        assert client.open("ingested").shape == (1_010, 2)
        with pytest.raises(dbapi.Error, match="exists"):
            cur.adbc_ingest("ingested", rows, mode="create")
        with pytest.raises(dbapi.Error, match="no dataset 'absent'"):
            cur.adbc_ingest("absent", rows, mode="append")
        assert cur.adbc_ingest("ingested", rows.slice(0, 5), mode="replace") == 5
        assert client.open("ingested").shape == (5, 2) and len(client.versions("ingested")) == 3
        cur.execute("SELECT count(*) AS n FROM ingested")
        assert cur.fetchall() == [(5,)]


BAD_QUERIES = (("SELEC 1", "syntax", "INVALID_ARGUMENT", fp.RequestRejected),
               ("SELECT nope FROM trips", "nope", "INVALID_ARGUMENT", fp.RequestRejected),
               ("SELECT fare + 'x' FROM trips", "fare", "INVALID_ARGUMENT", fp.RequestRejected),
               ("SELECT sqr(fare) FROM trips", 'did you mean "sqrt"', "INVALID_ARGUMENT", fp.RequestRejected),
               ("SELECT * FROM nosuch", "nosuch", "NOT_FOUND", fp.DatasetNotFound),
               ("SELECT * FROM trip", 'did you mean "trips"', "NOT_FOUND", fp.DatasetNotFound))


@pytest.mark.parametrize("sql,words,status,error", BAD_QUERIES, ids=[q[2] + ":" + q[0] for q in BAD_QUERIES])
def test_bad_sql_and_unknown_tables_are_clear_errors_and_the_catalog_keeps_answering(taxi, cluster, sql, words, status,
                                                                                    error):
    """As SQL clients sort errors: the client's mistake is a ``ProgrammingError`` with the status INVALID_ARGUMENT or
    NOT_FOUND, one line, no traceback; flightpart's own client raises the class of the code."""
    adbc = pytest.importorskip("adbc_driver_manager")
    _table, _zones, conn = taxi
    with pytest.raises(dbapi.ProgrammingError) as info:
        answer(conn, sql)
    text = str(info.value)
    assert info.value.status_code == getattr(adbc.AdbcStatusCode, status), text
    assert words in text.lower() and "Traceback" not in text and ".py" not in text, text
    assert "pg_" not in text, text  # DuckDB's guesses among its own system tables are not offered
    with fp.connect(cluster.uri) as client, pytest.raises(error) as ours:
        client.sql(sql)
    assert words in ours.value.message.lower() and "[flightpart" not in ours.value.message
    assert ours.value.field == "query"
    assert answer(conn, "SELECT 1 AS one").column("one").to_pylist() == [1]


def assert_clean(text: str) -> None:
    """An error's text as a client sees it: one message, no Python traceback, no path of the server's files."""
    assert "Traceback" not in text and "/work/" not in text and ".py" not in text, text


def refused_alike(raw: flight.FlightClient, command: flight.FlightDescriptor, code: str) -> None:
    """GetFlightInfo of ``command`` refused with ``code``, and GetSchema with the same message, the code at the end of
    its one line, no traceback (pyarrow sends no Flight error's status from GetSchema)."""
    with pytest.raises(flight.FlightError) as by_info:
        raw.get_flight_info(command)
    assert code_of(by_info.value) == code
    with pytest.raises(pa.ArrowException) as by_schema:
        raw.get_schema(command)
    assert fp.wire.error_message(by_info.value) in str(by_schema.value)
    assert f"[flightpart {code} at query]" in str(by_schema.value)
    assert_clean(str(by_schema.value))


def test_get_schema_errors_come_as_get_flight_info_sends_them_without_a_traceback(taxi, cluster, monkeypatch):
    """pyarrow sends a Flight error raised in GetSchema as UNKNOWN with the Python traceback and without its code:
    GetSchema's errors come with the status of the same query's GetFlightInfo where pyarrow can send it there
    (INVALID_ARGUMENT, NOT_FOUND), else UNKNOWN; always one clean line ending with the flightpart code, for a
    query and for a prepared statement."""
    from flightpart.sql.server import MAX_QUERY_CHARACTERS

    raw = flight.connect(cluster.uri)
    for sql, status in (("SELEC 1", pa.ArrowInvalid), ("SELECT * FROM nosuch", pa.ArrowKeyError)):
        command = sql_command(sqlwire.STATEMENT_QUERY, (1, sql))
        with pytest.raises(status) as by_info:
            raw.get_flight_info(command)
        with pytest.raises(status) as by_schema:
            raw.get_schema(command)
        assert fp.wire.error_message(by_schema.value) == fp.wire.error_message(by_info.value), sql
        assert_clean(str(by_schema.value))
    refused_alike(raw, sql_command(sqlwire.STATEMENT_QUERY, (1, "SELECT " + "1" * MAX_QUERY_CHARACTERS)),
                  "LIMIT_EXCEEDED")
    with fp.connect(cluster.uri) as writer:
        writer.put("fleeting", pa.table({"k": [1, 2, 3]}))
    action = flight.Action("CreatePreparedStatement", sqlwire.pack(sqlwire.CREATE_PREPARED, sqlwire.message(
        (1, "SELECT k, rank() OVER (ORDER BY k) AS r FROM fleeting"))))
    handle = sqlwire.bytes_field(sqlwire.unpack(next(iter(raw.do_action(action))).body.to_pybytes()).value, 1, "handle")
    prepared = sql_command(sqlwire.PREPARED_QUERY, (1, handle))
    assert raw.get_schema(prepared).schema.names == ["k", "r"]
    with monkeypatch.context() as busy:
        busy.setattr(cluster.catalog.gateway.slots, "limit", 0)  # no query runs, none waits: BUSY at once
        refused_alike(raw, prepared, "BUSY")
    with fp.connect(cluster.uri) as writer:
        writer.drop("fleeting")
    with pytest.raises(pa.ArrowKeyError) as by_info:
        raw.get_flight_info(prepared)
    with pytest.raises(pa.ArrowKeyError) as by_schema:
        raw.get_schema(prepared)
    assert fp.wire.error_message(by_schema.value) == fp.wire.error_message(by_info.value)
    assert "fleeting" in str(by_schema.value) and "DATASET_NOT_FOUND" in str(by_schema.value)
    assert_clean(str(by_schema.value))


def test_a_table_type_that_is_not_utf8_is_the_requests_mistake(taxi, cluster):
    """CommandGetTables' table_types are strings: one that is not UTF-8 is refused INVALID_ARGUMENT naming the field,
    through GetFlightInfo and GetSchema alike, not failed as the server's INTERNAL."""
    raw = flight.connect(cluster.uri)
    command = sql_command(sqlwire.GET_TABLES, (4, "TABLE"), (4, b"\xff\xfeTABLE"))
    for call in (raw.get_flight_info, raw.get_schema):
        with pytest.raises(pa.ArrowInvalid, match="table_types entry .* is not UTF-8") as caught:
            call(command)
        assert "[flightpart INVALID_REQUEST at table_types]" in str(caught.value)
        assert_clean(str(caught.value))
    listed = raw.get_flight_info(sql_command(sqlwire.GET_TABLES, (4, "TABLE")))
    names = raw.do_get(listed.endpoints[0].ticket).read_all().column("table_name").to_pylist()
    assert "trips" in names


def test_a_query_past_duckdbs_memory_limit_is_the_catalogs_limit_not_the_clients_mistake(taxi, cluster, monkeypatch):
    """DuckDB's out-of-memory error is LIMIT_EXCEEDED, the catalog's limit, sent as every LIMIT_EXCEEDED is (UNKNOWN
    with its code in ``extra_info``: a Python Flight server cannot send RESOURCE_EXHAUSTED), an ``OperationalError``
    and not the ``ProgrammingError`` of a mistake in the query; its message says what the client can do, not
    DuckDB's ``SET`` (which the gateway refuses)."""
    from flightpart.sql.engine import Engine

    adbc = pytest.importorskip("adbc_driver_manager")
    _table, _zones, conn = taxi
    small = Engine(32 << 20, 1 << 30)
    monkeypatch.setattr(cluster.catalog.gateway, "engine", small)
    sql = "SELECT list(range) AS l FROM range(20000000)"  # 160 MB in one list: DuckDB cannot spill it
    with pytest.raises(dbapi.OperationalError) as info:
        answer(conn, sql)
    text = str(info.value)
    # not INVALID_ARGUMENT, nor a retry's UNAVAILABLE
    assert info.value.status_code == adbc.AdbcStatusCode.UNKNOWN, text
    assert f"more memory than the {32 << 20:,} bytes" in text and "fewer rows or columns" in text, text
    assert "SET" not in text and "memory_limit" not in text, text
    assert_clean(text)
    with fp.connect(cluster.uri) as client, pytest.raises(fp.LimitExceeded, match="more memory") as ours:
        client.sql(sql).to_arrow()
    assert ours.value.code == "LIMIT_EXCEEDED" and ours.value.field == "query"
    assert answer(conn, "SELECT 1 AS one").column("one").to_pylist() == [1]
    small.close()


def test_a_node_that_fails_a_scan_inside_duckdb_is_the_error_the_client_gets(make_cluster):
    """A query DuckDB runs at the catalog reads datasets through scans whose streams are flightpart reads; a node's
    failure there reached the client as DuckDB's Invalid Input Error around a Python traceback, INVALID_ARGUMENT.
    It comes as the read's own error: UNAVAILABLE, naming the partition and the replica, with no traceback."""
    adbc = pytest.importorskip("adbc_driver_manager")
    lone = make_cluster(1, process=True)
    with fp.connect(lone.uri) as writer:
        writer.put("lonely", pa.table({"k": list(range(1_000)), "v": [f"v{k % 7}" for k in range(1_000)]}),
                   tiling=(2, 1))
    sql = "SELECT k, rank() OVER (ORDER BY v) AS r FROM lonely"  # a window function: DuckDB scans at the catalog
    node = lone.nodes[0]
    node.proc.kill()
    node.proc.wait()
    with dbapi.connect(lone.uri) as conn, pytest.raises(dbapi.OperationalError) as info:
        answer(conn, sql)
    text = str(info.value)
    assert info.value.status_code == adbc.AdbcStatusCode.IO, text  # UNAVAILABLE
    assert "'lonely'" in text and "no replica could serve it" in text, text
    assert "Invalid Input Error" not in text, text
    assert_clean(text)
    with fp.connect(lone.uri) as client, pytest.raises(fp.NodeUnavailable, match="no replica could serve it") as ours:
        client.sql(sql).to_arrow()
    assert ours.value.code == "UNAVAILABLE"
    assert_clean(ours.value.message)


def test_a_query_past_the_clients_deadline_is_stopped_at_the_catalog(cluster):
    """The driver's query timeout is a gRPC deadline; the catalog sees the call given up and stops DuckDB, instead of
    running a query nobody waits for until its own 300 s limit."""
    stopped = lambda: fp.connect(cluster.uri).call(fp.wire.GetStats()).values["sql_queries_abandoned"]  # noqa: E731
    before = stopped()
    with dbapi.connect(cluster.uri, db_kwargs={"adbc.flight.sql.rpc.timeout_seconds.query": "1"}) as conn:
        with pytest.raises(dbapi.OperationalError, match="(?i)deadline|timeout"):
            answer(conn, "SELECT sum(hash(a.range * b.range)) FROM range(200000) a, range(200000) b")
        deadline = time.monotonic() + 30
        while stopped() == before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stopped() == before + 1
        assert answer(conn, "SELECT 41 + 1 AS x").column("x").to_pylist() == [42]


def test_a_query_cannot_reach_the_catalogs_files_or_change_anything(taxi, cluster):
    _table, _zones, conn = taxi
    for sql in ("SELECT * FROM read_csv('/etc/passwd')", "COPY (SELECT 1) TO '/tmp/flightpart-sql-escape.csv'",
                "INSTALL httpfs"):
        with pytest.raises(dbapi.Error) as info:
            answer(conn, sql)
        assert "root:" not in str(info.value)
    with pytest.raises(dbapi.Error):
        answer(conn, "CREATE TABLE t AS SELECT 1")
    with fp.connect(cluster.uri) as client:
        assert "t" not in {d.name for d in client.list()}


def test_pandas_and_polars_read_through_the_driver(taxi, cluster):
    table, _zones, _conn = taxi
    sql = "SELECT payment, count(*) AS n FROM trips GROUP BY payment ORDER BY payment"
    want = local(table).sql(sql).to_arrow_table()
    with dbapi.connect(cluster.uri) as conn:
        frame = pd.read_sql(sql, conn)
        assert frame["n"].tolist() == want.column("n").to_pylist()
    polars = pl.read_database(sql, dbapi.connect(cluster.uri))
    assert polars["payment"].to_list() == want.column("payment").to_pylist()


def sql_command(name: str, *fields) -> flight.FlightDescriptor:
    return flight.FlightDescriptor.for_command(sqlwire.pack(name, sqlwire.message(*fields)))


def test_xdbc_type_info_lists_the_types_answers_come_in(taxi, cluster):
    """GetXdbcTypeInfo in the protocol's columns and order; each type an answer over the taxi table has is listed."""
    table, _zones, _conn = taxi
    raw = flight.connect(cluster.uri)
    every = raw.do_get(raw.get_flight_info(sql_command(sqlwire.GET_XDBC_TYPE_INFO)).endpoints[0].ticket).read_all()
    assert every.schema.names[:3] == ["type_name", "data_type", "column_size"] and every.num_columns == 19
    assert not every.schema.field("data_type").nullable and every.schema.field("column_size").nullable
    keys = list(zip(every.column("data_type").to_pylist(), every.column("type_name").to_pylist()))
    assert keys == sorted(keys)
    answered = {str(t).split("(")[0] for t in duckdb_over(table, zones_table()).sql("SELECT * FROM trips").types}
    assert answered <= set(every.column("type_name").to_pylist()), answered
    bigint = raw.do_get(raw.get_flight_info(sql_command(sqlwire.GET_XDBC_TYPE_INFO, (1, -5))).endpoints[0].ticket)
    assert bigint.read_all().column("type_name").to_pylist() == ["BIGINT", "UBIGINT"]


def test_close_session_is_answered_and_forgets_nothing_of_anyone(taxi, cluster):
    """The driver's close() sends CloseSession: answered NOT_CLOSEABLE (the catalog keeps no session, so one
    connection's close cannot be told from another's), and every prepared statement still answers."""
    query = "SELECT count(*) AS n FROM trips WHERE passengers > 2"

    def prepare(client: flight.FlightClient) -> bytes:
        action = flight.Action("CreatePreparedStatement",
                               sqlwire.pack(sqlwire.CREATE_PREPARED, sqlwire.message((1, query))))
        result = sqlwire.unpack(next(iter(client.do_action(action))).body.to_pybytes())
        return sqlwire.bytes_field(result.value, 1, "handle")

    def run(client: flight.FlightClient, handle: bytes) -> int:
        info = client.get_flight_info(sql_command(sqlwire.PREPARED_QUERY, (1, handle)))
        return client.do_get(info.endpoints[0].ticket).read_all().column("n")[0].as_py()

    closing, staying = flight.connect(cluster.uri), flight.connect(cluster.uri)
    mine, theirs = prepare(closing), prepare(staying)
    (answer,) = closing.do_action(flight.Action("CloseSession", b""))
    assert answer.body.to_pybytes() == sqlwire.message((1, 3))  # CloseSessionResult{status: NOT_CLOSEABLE}
    assert run(closing, mine) == run(staying, theirs) > 0
    with dbapi.connect(cluster.uri) as conn, conn.cursor() as cur:  # its close() sends CloseSession too
        cur.execute(query)
        assert cur.fetchall() == [(run(staying, theirs),)]


def answers_of_64_mb(cluster, name: str, monkeypatch) -> tuple[flight.FlightClient, flight.FlightDescriptor,
                                                               flight.FlightInfo]:
    """A dataset ``name`` whose sorted rows are a 64 MB answer the catalog sends itself (more than a stream's
    flow-control windows and socket buffers take, about 15 MB on loopback), the catalog's budget for answers set to
    two and a half of them; a client, the query and its first FlightInfo."""
    import numpy as np

    with fp.connect(cluster.uri) as writer:
        writer.put(name, pa.table({"a": np.arange(4_000_000), "b": np.arange(4_000_000) * 2}), tiling=(2, 1))
    raw = flight.connect(cluster.uri)
    query = sql_command(sqlwire.STATEMENT_QUERY, (1, f"SELECT a, b FROM {name} ORDER BY a"))
    first = raw.get_flight_info(query)
    for limit in ("total", "per_caller"):  # the test's client is every caller: the whole budget is its share
        monkeypatch.setattr(cluster.catalog.answers, limit, int(first.total_bytes * 2.5))
    return raw, query, first


def test_answers_being_sent_count_against_the_catalogs_budget_until_their_streams_end(taxi, cluster, monkeypatch):
    """Answers whose streams were opened and left unread held the catalog's memory without bound (20 of 300 MB:
    6.45 GB): they count against the catalog's budget for answers until their streams end, and past it a new answer is
    refused BUSY."""
    raw, query, first = answers_of_64_mb(cluster, "wide", monkeypatch)
    held = [raw.do_get(first.endpoints[0].ticket)]
    try:
        held.append(raw.do_get(raw.get_flight_info(query).endpoints[0].ticket))
        for stream in held:
            stream.read_chunk()  # one batch read, the rest left: the stream stays open
        with pytest.raises(flight.FlightError, match="busy: answers being sent hold") as caught:
            raw.get_flight_info(query)
        assert code_of(caught.value) == "BUSY"
    finally:
        for stream in held:
            stream.cancel()
    deadline = time.monotonic() + 60
    while True:  # the streams end as the server sees the cancels
        try:
            answered = raw.do_get(raw.get_flight_info(query).endpoints[0].ticket).read_all()
            break
        except flight.FlightError:
            assert time.monotonic() < deadline, "the cancelled streams still count"
            time.sleep(0.2)
    assert answered.num_rows == 4_000_000 and answered.column("a").to_pylist()[:3] == [0, 1, 2]


KILLED_CLIENT = """
import sys, time
import pyarrow.flight as flight
from flightpart import sqlwire
from flightpart.errors import FlightpartError
raw = flight.connect(sys.argv[1])
query = sqlwire.pack(sqlwire.STATEMENT_QUERY, sqlwire.message((1, "SELECT a, b FROM orphaned ORDER BY a")))
info = raw.get_flight_info(flight.FlightDescriptor.for_command(query))
streams = [raw.do_get(info.endpoints[0].ticket)]
streams[0].read_chunk()
print("READING", flush=True)
time.sleep(600)
"""


def test_answers_of_a_client_killed_while_reading_are_let_go_at_once(taxi, cluster):
    """A client killed with kill -9 in the middle of an answer: its connection closes, the stream ends, and the
    answer no longer counts against the catalog's budget (long before the idle time lets it go)."""
    import signal
    import subprocess
    import sys

    import numpy as np

    with fp.connect(cluster.uri) as writer:
        writer.put("orphaned", pa.table({"a": np.arange(4_000_000), "b": np.arange(4_000_000) * 2}), tiling=(2, 1))
    assert cluster.catalog.answers_sent.idle_seconds >= 60
    client = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, cluster.uri], stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "READING"
        assert cluster.catalog.answers_sent.held_bytes() >= 64_000_000  # the rest of its answer, unread
        client.send_signal(signal.SIGKILL)
        client.wait(30)
        deadline = time.monotonic() + 30  # half the idle time: only the closed connection can end it by then
        while cluster.catalog.answers_sent.held_bytes() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cluster.catalog.answers_sent.held_bytes() == 0
    finally:
        client.kill()
        client.wait(30)


def settled(answers, still: float = 0.3) -> None:
    """Until no answer stream has been pulled for ``still`` seconds (gRPC fills a stream's buffers a while after it
    opens: a fixed sleep would order two streams' idle times only on a quiet machine)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if answers.quiet_seconds() >= still:
            return
        time.sleep(0.05)
    raise AssertionError("an answer stream was still being pulled after 60 s")


def test_answers_whose_readers_take_nothing_are_let_go_when_another_needs_the_room(taxi, cluster, monkeypatch):
    """A client that opened answers' streams and took nothing held the catalog's budget for answers as long as its
    connection lived, and every other client got BUSY. Streams whose readers took nothing for the idle time now let
    their answers go when a new answer needs the room, the longest idle first and no more than it needs (a slow
    reader drains ~15 MB of buffers unseen, so idling alone cuts no one): the new answer is admitted, the stream let
    go ends UNAVAILABLE saying why, after what it had buffered, and the other reads to its end."""
    raw, query, first = answers_of_64_mb(cluster, "idled", monkeypatch)
    held = [raw.do_get(first.endpoints[0].ticket)]
    held[0].read_chunk()
    # the first stream's buffers are full: it idles longest, on a loaded machine too
    settled(cluster.catalog.answers_sent)
    held.append(raw.do_get(raw.get_flight_info(query).endpoints[0].ticket))
    try:
        held[1].read_chunk()
        with pytest.raises(flight.FlightError, match="busy: answers being sent hold"):
            raw.get_flight_info(query)
        monkeypatch.setattr(cluster.catalog.answers_sent, "idle_seconds", 0.5)
        time.sleep(1.0)
        small = sql_command(sqlwire.STATEMENT_QUERY, (1, "SELECT a FROM idled ORDER BY a LIMIT 10"))
        assert raw.do_get(raw.get_flight_info(small).endpoints[0].ticket).read_all().num_rows == 10
        assert cluster.catalog.answers_sent.held_bytes() >= 2 * first.total_bytes  # room enough: none let go
        answered = raw.do_get(raw.get_flight_info(query).endpoints[0].ticket).read_all()
        assert answered.num_rows == 4_000_000 and answered.column("b")[-1].as_py() == 7_999_998
        with pytest.raises(flight.FlightUnavailableError, match="its reader took nothing for 0.5 s") as ended:
            while True:
                held[0].read_chunk()
        assert code_of(ended.value) == "UNAVAILABLE"
        assert held[1].read_all().num_rows > 0  # the rest of its answer, to the end
        assert cluster.catalog.answers_sent.held_bytes() == 0
    finally:
        for stream in held:
            stream.cancel()


def test_an_answer_with_a_dictionary_column_reaches_the_client(taxi, cluster):
    """DuckDB's ENUM is a dictionary column: an answer with one failed in every client ("IPC stream did not have the
    expected (1) dictionaries"), since a generator stream sends no dictionaries."""
    _table, _zones, conn = taxi
    sql = "SELECT i, (['a', 'b', 'c'][1 + i % 3])::ENUM('a', 'b', 'c') AS e FROM range(400000) t(i) ORDER BY i"
    got = answer(conn, sql)
    assert got.num_rows == 400_000 and pa.types.is_dictionary(got.schema.field("e").type)
    assert got.column("e").to_pylist()[:4] == ["a", "b", "c", "a"]
    with fp.connect(cluster.uri) as client:
        assert client.sql(sql).to_arrow().column("e").to_pylist()[-1] == ["a", "b", "c"][399_999 % 3]


def test_the_catalogs_own_get_schema_and_do_get_refuse_without_a_traceback(taxi, cluster):
    """GetSchema of a dataset path (or of bytes that are no Flight SQL command) and DoGet of a ticket that is no
    Flight SQL answer's came back with pyarrow's traceback and the server's paths (UNKNOWN, UNIMPLEMENTED)."""
    raw = flight.connect(cluster.uri)
    assert raw.get_schema(flight.FlightDescriptor.for_path("trips")).schema.names[:2] == taxi[0].schema.names[:2]
    with pytest.raises(pa.ArrowKeyError) as unknown:
        raw.get_schema(flight.FlightDescriptor.for_path("nosuch"))
    assert "DATASET_NOT_FOUND" in str(unknown.value)
    assert_clean(str(unknown.value))
    for descriptor in (flight.FlightDescriptor.for_command(b"\xff\xff\xff"),
                       flight.FlightDescriptor.for_path("a", "b", "c")):
        with pytest.raises(pa.ArrowException) as refused:
            raw.get_schema(descriptor)
        assert "[flightpart " in str(refused.value)
        assert_clean(str(refused.value))
    for ticket in (b"", b"\xff", sqlwire.pack(sqlwire.STATEMENT_QUERY, sqlwire.message((1, "SELECT 1")))):
        with pytest.raises(pa.ArrowInvalid, match="TicketStatementQuery") as refused:
            raw.do_get(flight.Ticket(ticket)).read_all()
        assert "[flightpart INVALID_REQUEST at ticket]" in str(refused.value)
        assert_clean(str(refused.value))


@pytest.mark.parametrize("tiling", [(3, 1), (3, 2)])
def test_a_dataset_put_from_pandas_with_an_index_answers_queries_that_name_it_or_not(cluster, tiling):
    """A DataFrame's named index is stored as a column every view carries: a query selecting some columns got them
    with the index too, which DuckDB refused ("answered with 2 columns where 1 were requested"), and one naming the
    index failed (INTERNAL in SQL, KeyError in Polars). Each engine now gets exactly the columns it asks for. With
    several column groups the index was assembled after the first group's columns and the reader DuckDB, Polars
    and SQL scan relabelled columns by position: every column after the first held its neighbour's values."""
    import numpy as np

    frame = pd.DataFrame({"x": np.arange(300), "y": np.arange(300) * 0.5, "s": [f"s{k}" for k in range(300)]},
                         index=pd.Index(np.arange(300) + 1000, name="idx"))
    flat = pa.Table.from_pandas(frame)
    local = duckdb.connect()
    local.register("indexed", flat)
    with fp.connect(cluster.uri) as client:
        client.put("indexed", frame, tiling=tiling)
        for sql in ("SELECT x FROM indexed WHERE idx > 1290 ORDER BY x", "SELECT idx FROM indexed ORDER BY idx LIMIT 3",
                    "SELECT idx, y FROM indexed WHERE x < 3 ORDER BY idx",
                    "SELECT count(*) AS n FROM indexed WHERE idx >= 1100",
                    "SELECT * FROM indexed ORDER BY idx DESC LIMIT 2"):
            assert client.sql(sql).to_arrow().to_pydict() == local.sql(sql).to_arrow_table().to_pydict(), sql
        ds = client.open("indexed")
        assert ds.to_duckdb().filter("idx > 1297").project("x").order("x").fetchall() == [(298,), (299,)]
        lazy = ds.to_polars(lazy=True)
        assert lazy.filter(pl.col("idx") > 1297).select("x").collect()["x"].to_list() == [298, 299]
        assert lazy.select("idx").head(2).collect()["idx"].to_list() == [1000, 1001]
        assert ds.to_pandas().equals(frame)  # the index is still the frame's index
        assert ds.to_arrow().column_names == ds.schema.names == flat.column_names
        assert pa.table(ds).to_pydict() == flat.to_pydict()
        assert pl.DataFrame(ds).to_dict(as_series=False) == pl.from_arrow(flat).to_dict(as_series=False)


def test_duckdb_describing_the_catalog_itself_is_not_answered(taxi, cluster):
    """The catalog's DuckDB described itself to any SQL client: ``duckdb_settings()`` (or its view ``pg_settings``)
    listed the catalog's working directory, ``duckdb_extensions()`` and ``duckdb_secrets()`` failed naming its home
    directory, ``pragma_*`` and ``current_setting`` told the rest, and ``query()`` runs any of them from a string.
    A query naming one, in whatever syntax, is refused INVALID_REQUEST before it runs, in flightpart's client and
    through ADBC; a dataset (or a version of one, or a WITH query) whose name starts alike is still answered, and
    so are the table functions that make rows from their arguments."""
    import os

    _table, _zones, conn = taxi
    hidden = (os.getcwd(), os.path.expanduser("~"))
    with fp.connect(cluster.uri) as client:
        client.put("duckdb_notes", pa.table({"x": [1, 2, 3]}))
        for sql in ("SELECT * FROM duckdb_settings()", "SELECT extension_name, install_path FROM duckdb_extensions()",
                    "SELECT * FROM duckdb_secrets()", "FROM pragma_database_list",
                    "SELECT current_setting('allowed_paths')",
                    "SELECT x FROM duckdb_notes WHERE x IN (SELECT 1 FROM system.main.DUCKDB_MEMORY())",
                    "WITH s AS (SELECT * FROM which_secret('s3://b/k', 's3')) SELECT * FROM s",
                    "SELECT * FROM pg_catalog.pg_settings", "SELECT * FROM query('SELECT * FROM duckdb_settings()')",
                    "FROM query_table('duckdb_settings')", 'SELECT * FROM "DuckDB_Settings"()'):
            with pytest.raises(FlightpartError) as refused:
                client.sql(sql).to_arrow()
            assert (refused.value.code == "INVALID_REQUEST"
                    and "DuckDB describing or running itself" in str(refused.value))
            assert not any(path in str(refused.value) for path in hidden), str(refused.value)
            with pytest.raises(Exception, match="DuckDB describing or running itself") as by_adbc:
                answer(conn, sql)
            assert not any(path in str(by_adbc.value) for path in hidden), str(by_adbc.value)
        for sql in ("SELECT sum(x) AS n FROM duckdb_notes", 'SELECT sum(x) AS n FROM "duckdb_notes@1"',
                    "WITH duckdb_x AS (SELECT x FROM duckdb_notes) SELECT sum(x) AS n FROM duckdb_x",
                    "SELECT sum(x) AS n FROM duckdb_notes WHERE x IN (SELECT * FROM generate_series(1, 3))"):
            assert client.sql(sql).to_arrow().column("n").to_pylist() == [6], sql
        assert client.sql("SELECT count(*) AS n FROM range(5)").to_arrow().column("n").to_pylist() == [5]


def test_a_datasets_name_matches_in_any_case_as_duckdb_matches_table_names(taxi, cluster):
    """A dataset put as ``CaseTrips`` had been NOT_FOUND as ``casetrips`` (a scan, an aggregate, a version), where
    DuckDB over the same table answers: its names match whatever their case."""
    table, _zones, conn = taxi
    with fp.connect(cluster.uri) as writer:
        writer.put("CaseTrips", table.slice(0, 1000), tiling=(2, 1))
    for sql in ("SELECT count(*) AS n FROM casetrips", 'SELECT count(*) AS n FROM "CASETRIPS"',
                "SELECT count(*) AS n FROM (SELECT * FROM casetrips WHERE fare > 0)",
                'SELECT count(*) AS n FROM "casetrips@1"'):
        assert answer(conn, sql).column("n").to_pylist() == [1000], sql
    with fp.connect(cluster.uri) as reader:
        assert reader.sql("SELECT * FROM casetrips").to_arrow().num_rows == 1000  # a plain scan, read from the nodes


def test_what_a_statement_announces_is_what_its_stream_carries(cluster):
    """A plain scan is sent by the nodes in the dataset's own types; GetSchema and a prepared statement had
    announced DuckDB's (a New York timestamp as UTC, a string view as a string), so a client that trusts the
    announced schema met another in the stream."""
    table = pa.table({"k": pa.array(range(100), pa.int64()),
                      "ts": pa.array(range(100), pa.timestamp("ms", tz="America/New_York")),
                      "s": pa.array([f"v{k}" for k in range(100)], pa.string_view())})
    with fp.connect(cluster.uri) as writer:
        writer.put("announced", table, tiling=(2, 1))
    with dbapi.connect(cluster.uri) as conn, conn.cursor() as cur:
        for sql in ("SELECT k, ts, s FROM announced WHERE k < 50", "SELECT k, ts FROM announced ORDER BY k LIMIT 5"):
            announced = cur.adbc_execute_schema(sql)
            cur.execute(sql)
            assert cur.fetch_arrow_table().schema.types == announced.types, sql
            cur.adbc_prepare(sql)
            assert cur.adbc_execute_schema(sql).types == announced.types, sql


def test_two_datasets_whose_names_differ_only_in_case_are_each_read_alone_and_refused_together(cluster):
    """DuckDB reads two tables named ``Pair`` and ``pair`` as one: a query naming both had counted one twice."""
    with fp.connect(cluster.uri) as client:
        client.put("Pair", pa.table({"a": [1]}))
        client.put("pair", pa.table({"a": [1, 2]}))
        assert client.sql("SELECT count(*) AS n FROM Pair").to_arrow().column("n").to_pylist() == [1]
        assert client.sql("SELECT count(*) AS n FROM pair").to_arrow().column("n").to_pylist() == [2]
        with pytest.raises(fp.RequestRejected,
                           match="'Pair' and 'pair' are two datasets whose names differ only in case"):
            client.sql("SELECT (SELECT count(*) FROM Pair) AS big, (SELECT count(*) FROM pair) AS small")


def test_a_version_has_its_schema_by_name_and_the_session_has_no_catalog_rather_than_an_unknown_action(cluster):
    """``adbc_get_table_schema("events@1")`` was NOT_FOUND though a query could name that version; an ADBC client's
    current catalog was refused with the list of the catalog's internal actions."""
    with fp.connect(cluster.uri) as client:
        client.put("evolving", pa.table({"a": [1]}))
        client.put("evolving", pa.table({"a": [1], "b": ["x"]}))
    with dbapi.connect(cluster.uri) as conn:
        assert conn.adbc_get_table_schema("evolving@1").names == ["a"]
        assert conn.adbc_get_table_schema("evolving").names == ["a", "b"]
        with pytest.raises(dbapi.ProgrammingError, match="current catalog not supported") as info:
            conn.adbc_current_catalog  # noqa: B018 - a property that asks the catalog
        assert "unknown action" not in str(info.value)


@pytest.mark.slow  # 300 datasets put and dropped: in the slow tier, which CI runs
def test_a_listing_that_runs_too_long_is_stopped_as_a_query_is(cluster, taxi, monkeypatch):
    """A query listing tables asks the catalog for each dataset's schema, in Python, which DuckDB's interrupt does not
    reach: over many datasets such a listing ran on past the query's time. It is stopped as any query is."""
    from flightpart.sql import watch

    gateway = cluster.catalog.gateway
    names = [f"listed_many_{k:03d}" for k in range(300)]
    with fp.connect(cluster.uri) as client:
        for name in names:
            client.put(name, pa.table({"x": [1]}))
        monkeypatch.setattr(watch, "WATCH_SECONDS", 0.005)
        monkeypatch.setattr(gateway, "timeout", 0.01)  # 300 schemas asked of the catalog take far longer
        try:
            with pytest.raises(fp.QueryTimeout, match="ran longer than the 0.01 s"):
                client.sql("SHOW TABLES").to_arrow()
        finally:
            monkeypatch.undo()
            for name in names:
                client.drop(name)
        assert "zones" in {row["name"] for row in client.sql("SHOW TABLES").to_arrow().to_pylist()}


def test_show_tables_and_information_schema_list_every_dataset(cluster, taxi):
    """Only the datasets a query names are registered with DuckDB, so ``SHOW TABLES`` and ``information_schema``
    had answered, through every client, that there was no table. Each lists every dataset, with its columns in
    DuckDB's types, and a query that also reads a dataset's rows still reads them."""
    trips, zones, conn = taxi
    with fp.connect(cluster.uri) as client:
        names = {entry.name.casefold() for entry in client.list()}  # DuckDB's table names: one whatever the case
        assert {"trips", "zones"} <= names
        with conn.cursor() as cur:
            cur.execute("SHOW TABLES")
            assert {row[0].casefold() for row in cur.fetchall()} == names
            cur.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'zones' "
                        "ORDER BY ordinal_position")
            want = local(trips, zones).sql("SELECT column_name, data_type FROM information_schema.columns "
                                           "WHERE table_name = 'zones' ORDER BY ordinal_position").fetchall()
            assert cur.fetchall() == want
        listed = client.sql("SELECT t.table_name, (SELECT count(*) FROM zones) AS zone_rows "
                            "FROM information_schema.tables t ORDER BY 1").to_arrow()
        assert {name.casefold() for name in listed.column("table_name").to_pylist()} == names
        assert set(listed.column("zone_rows").to_pylist()) == {zones.num_rows}
        with pytest.raises(fp.DatasetNotFound):  # a table that is no dataset is not read as an empty stand-in
            client.sql("SELECT count(*) FROM no_such_table, information_schema.schemata")
        # a dataset DuckDB cannot read whole (a dense union) is left out; one of a dictionary of float16 is listed
        client.put("listed_halves", pa.table({"h": pa.array([1.5, 2.5], pa.float16()).dictionary_encode()}))
        dense = pa.UnionArray.from_dense(pa.array([0], pa.int8()), pa.array([0], pa.int32()), [pa.array([1])])
        client.put("listed_dense", pa.table({"u": dense}))
        shown = {row["name"] for row in client.sql("SHOW TABLES").to_arrow().to_pylist()}
        assert "listed_halves" in shown and "listed_dense" not in shown and "zones" in shown
        assert client.sql("SELECT sum(h) AS s FROM listed_halves").to_arrow()["s"].to_pylist() == [4.0]
        # DuckDB's SHOW of one table (its DESCRIBE) had been refused as "Table with name zones does not exist!"
        want = local(trips, zones).sql("DESCRIBE zones").fetchall()
        for query in ("SHOW zones", 'show "zones"', "DESCRIBE zones", "/* which columns */ SHOW zones"):
            assert [tuple(row.values()) for row in client.sql(query).to_arrow().to_pylist()] == want, query
