"""Which queries have their aggregates computed on the nodes, and what DuckDB finishes. No cluster needed."""

from __future__ import annotations

import pytest

from flightpart.sql.pushed import PARTIALS, plan

KNOWN = {"trips", "zones"}


def test_a_group_by_becomes_partials_and_a_query_over_them():
    table, where, keys, aggregates, final = plan(
        "SELECT payment, count(*) AS n, avg(fare) AS fare FROM trips WHERE distance > 1 GROUP BY payment "
        "HAVING count(*) > 10 ORDER BY n DESC LIMIT 3", KNOWN)
    assert (table, where, keys) == ("trips", "distance > 1", ["payment"])
    assert aggregates == [("", "count_all"), ("fare", "mean")]
    assert f"FROM {PARTIALS}" in final and '"count_all" > 10' in final and "GROUP BY" not in final
    assert final.endswith("ORDER BY n DESC LIMIT 3")


def test_a_global_aggregate_has_no_keys():
    _table, where, keys, aggregates, _final = plan("SELECT sum(fare) AS s, min(pickup_at) FROM trips", KNOWN)
    assert (where, keys, sorted(aggregates)) == (None, [], [("fare", "sum"), ("pickup_at", "min")])


def test_count_distinct_is_grouped_by_its_column_on_the_nodes_and_counted_at_the_catalog():
    table, where, keys, aggregates, final = plan(
        "SELECT payment, count(DISTINCT pickup_zone) AS zones FROM trips WHERE fare > 5 GROUP BY payment "
        "HAVING count(DISTINCT pickup_zone) > 3 ORDER BY zones DESC", KNOWN)
    assert (table, where, keys, aggregates) == ("trips", "fare > 5", ["payment", "pickup_zone"], [("", "count_all")])
    assert f"FROM {PARTIALS}" in final and 'COUNT("pickup_zone")' in final and "GROUP BY payment" in final
    assert "HAVING" in final and "DISTINCT" not in final
    _t, _w, keys, _a, final = plan("SELECT count(DISTINCT pickup_zone) FROM trips", KNOWN)
    assert keys == ["pickup_zone"] and "GROUP BY" not in final


def test_count_distinct_beside_other_aggregates_takes_every_partial_by_the_keys_and_its_column():
    table, where, keys, aggregates, final = plan(
        "SELECT payment, count(DISTINCT pickup_zone) AS zones, sum(fare) AS s, avg(tip) AS a, count(*) AS n "
        "FROM trips WHERE fare > 5 GROUP BY payment HAVING count(*) > 3 ORDER BY s DESC", KNOWN)
    assert (table, where, keys) == ("trips", "fare > 5", ["payment", "pickup_zone"])
    assert aggregates == [("fare", "sum"), ("tip", "sum"), ("tip", "count"), ("", "count_all")]
    assert f"FROM {PARTIALS}" in final and "GROUP BY payment" in final and "DISTINCT" not in final
    assert 'COUNT("pickup_zone") AS zones' in final and 'SUM("tip_sum") / SUM("tip_count") AS a' in final
    assert 'HAVING CAST(COALESCE(SUM("count_all"), 0) AS BIGINT) > 3' in final
    _t, _w, keys, aggregates, final = plan("SELECT count(DISTINCT pickup_zone), sum(fare) FROM trips", KNOWN)
    assert keys == ["pickup_zone"] and aggregates == [("fare", "sum")] and "GROUP BY" not in final


@pytest.mark.parametrize("query", [
    "SELECT count(DISTINCT pickup_zone), count(DISTINCT payment) FROM trips",
    "SELECT count(DISTINCT pickup_zone), sum(fare * 2) FROM trips",
    "SELECT payment, count(*) FILTER (WHERE tip > 5) FROM trips GROUP BY payment",
    "SELECT payment, avg(fare) FILTER (WHERE tip > 5), count(DISTINCT pickup_zone) FROM trips GROUP BY payment",
    "SELECT payment, fare, count(DISTINCT pickup_zone), sum(fare) FROM trips GROUP BY payment",
    "SELECT pickup_zone, count(DISTINCT pickup_zone) FROM trips",
    "SELECT sum(fare * 100) FROM trips",
    "SELECT z.borough, count(*) FROM trips JOIN zones z ON z.zone = trips.pickup_zone GROUP BY z.borough",
    "SELECT payment, fare FROM trips",
    "SELECT payment, rank() OVER (ORDER BY fare) FROM trips",
    "SELECT fare, count(*) FROM trips GROUP BY payment",
    "SELECT count(*) FROM nosuch",
    "SELECT median(fare) FROM trips",
    "WITH t AS (SELECT * FROM trips) SELECT count(*) FROM t",
    "SELEC 1",
])
def test_anything_else_is_left_to_duckdb_whole(query):
    assert plan(query, KNOWN) is None
